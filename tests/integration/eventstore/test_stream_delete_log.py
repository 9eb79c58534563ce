"""A stream's delete reaches the log through capture alone: on `events.<stream_type>` a delete
marker and the key's tombstone follow the stream's events, and a projection rebuilt from the topic
has no row for the deleted stream (and the recreated one's new events only). Compaction of the
topic (policy `tombstones`) removes the deleted streams' records and keeps every other record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.integration.capture.helpers import cli, records
from tributary.eventstore.examples.bank import bank_account
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.migrate import run_migrations
from tributary.eventstore.store import EventStore
from tributary.projections.examples import account_balances
from tributary.projections.local import LocalView, run_local
from tributary.projections.records import ProjectionRecord, decode

pytestmark = pytest.mark.integration


def _capture(config: Path) -> None:
    done = cli("capture", "--config", str(config), "--until-idle", "2")
    assert done.returncode == 0, done.stdout + done.stderr


def _projection_rows(log_root: Path) -> dict[str, dict[str, str]]:
    """`account_balances` rebuilt from the whole topic: {account id: row}."""
    log: dict[tuple[str, int], list[ProjectionRecord]] = {}
    for r in records(log_root, "events.account"):
        rec = decode("events.account", r.partition, r.offset, r.timestamp, r.key, r.value, r.headers)
        log.setdefault((rec.topic, rec.partition), []).append(rec)
    view = LocalView()
    run_local(account_balances.PROJECTION, log, view)
    columns = [c.name for c in account_balances.TABLE.columns]
    out = {}
    for line in view.table():
        row = dict(zip(columns, line.rstrip("\n").split("\t"), strict=True))
        out[row["account_id"]] = row
    return out


def _by_stream(log_root: Path) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for r in records(log_root, "events.account"):
        out.setdefault(orjson.loads(r.key), []).append(None if r.value is None else orjson.loads(r.value))
    return out


def test_a_delete_reaches_the_log_and_a_rebuilt_projection(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    config = tmp_path / "t.toml"
    log_root = tmp_path / "log"
    config.write_text(
        f'[service]\ndsn = "{fresh_db}"\n\n[log]\nroot = "{log_root}"\npartitions = 2\nlinger_ms = 2\n'
        "segment_bytes = 4096\n"  # small segments: compaction touches only sealed ones
    )
    init = cli("init", "--config", str(config))
    assert init.returncode == 0, init.stdout + init.stderr
    store = EventStore.connect(fresh_db, max_size=2)
    try:
        handler = CommandHandler(store, {"account": bank_account()})
        for name in ("keep", "soft", "hard"):
            handler.handle("account", name, "open", {"owner": name})
            handler.handle("account", name, "deposit", {"amount": "5.00"})
        for _ in range(20):  # more than a segment of each of them
            for name in ("soft", "hard"):
                handler.handle("account", name, "deposit", {"amount": "1.00"})
        _capture(config)
        assert set(_projection_rows(log_root)) == {"keep", "soft", "hard"}

        store.delete_stream("soft")
        store.delete_stream("hard", hard=True)
        _capture(config)
        streams = _by_stream(log_root)
        assert [v["type"] for v in streams["keep"]] == ["AccountOpened", "MoneyDeposited"]
        for name, hard in (("soft", False), ("hard", True)):
            *events, marker, tombstone = streams[name]
            assert [e["version"] for e in events] == list(range(1, 23))
            assert marker["type"] == "$stream_deleted" and marker["stream"] == name
            assert (marker["stream_type"], marker["hard"], marker["version"]) == ("account", hard, 22)
            assert tombstone is None
        assert set(_projection_rows(log_root)) == {"keep"}

        handler.handle("account", "soft", "open", {"owner": "again"}, expected_version="no_stream")
        _capture(config)
        rows = _projection_rows(log_root)
        assert set(rows) == {"keep", "soft"}
        assert (rows["soft"]["owner"], rows["soft"]["balance"], rows["soft"]["last_version"]) == ("again", "0", "23")

        for _ in range(40):  # the deletes end up in sealed segments
            handler.handle("account", "keep", "deposit", {"amount": "1.00"})
        _capture(config)
        before = _by_stream(log_root)
        compacted = cli("log", "compact", "events.account", "--config", str(config))
        assert compacted.returncode == 0, compacted.stdout + compacted.stderr
        after = _by_stream(log_root)
        assert after["hard"] == [None]  # the tombstone, kept for [log] delete retention
        assert [None if v is None else v["version"] for v in after["soft"]] == [None, 23]
        assert after["keep"] == before["keep"] and [v["version"] for v in after["keep"]] == list(range(1, 43))
        rows = _projection_rows(log_root)
        assert set(rows) == {"keep", "soft"} and rows["soft"]["owner"] == "again"
    finally:
        store.close()
