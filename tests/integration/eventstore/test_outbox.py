"""The outbox: every appended event reaches `events.<stream_type>` exactly once, in version order
per stream, through capture alone — kill -9 of capture included."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import orjson
import pytest

from tests.integration.capture.helpers import cli, records, spawn_capture
from tributary.eventstore.examples.bank import bank_account
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.migrate import run_migrations
from tributary.eventstore.store import EventStore

pytestmark = pytest.mark.integration


def _config(tmp_path: Path, dsn: str) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(f'[service]\ndsn = "{dsn}"\n\n[log]\nroot = "{tmp_path / "log"}"\npartitions = 3\nlinger_ms = 2\n')
    return path


def test_events_reach_the_log_exactly_once_across_crashes(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    store = EventStore.connect(fresh_db)
    handler = CommandHandler(store, {"account": bank_account()}, max_retries=20)
    for i in range(5):  # some events exist before capture ever ran: the snapshot carries them
        handler.handle("account", f"a{i}", "open", {"owner": f"o{i}"})
    config = _config(tmp_path, fresh_db)
    init = cli("init", "--config", str(config))
    assert init.returncode == 0, init.stdout + init.stderr
    stop = threading.Event()

    def commands() -> None:
        rng = random.Random(3)
        while not stop.is_set():
            handler.handle("account", f"a{rng.randrange(5)}", "deposit", {"amount": "1.00"})

    writer = threading.Thread(target=commands)
    writer.start()
    rng = random.Random(9)
    try:
        for _ in range(6):
            proc = spawn_capture(config)
            time.sleep(rng.uniform(1.0, 2.5))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        stop.set()
        writer.join()
    final = cli("capture", "--config", str(config), "--until-idle", "2")
    assert final.returncode == 0, final.stderr
    events = [orjson.loads(r.value) for r in records(tmp_path / "log", "events.account")]
    stored = [e for i in range(5) for e in store.read_stream(f"a{i}")]
    assert sorted(e["id"] for e in events) == sorted(str(e.event_id) for e in stored), "lost or duplicated events"
    per_stream: dict[str, list[int]] = {}
    for rec in records(tmp_path / "log", "events.account"):
        value = orjson.loads(rec.value)
        assert orjson.loads(rec.key) == value["stream"]
        per_stream.setdefault(value["stream"], []).append(value["version"])
    for stream, versions in per_stream.items():
        assert versions == list(range(1, len(versions) + 1)), f"{stream} out of order"
    sample = events[0]
    assert set(sample) >= {
        "id",
        "stream",
        "version",
        "type",
        "schema_version",
        "data",
        "metadata",
        "occurred_at",
        "recorded_at",
    }
    store.close()
