"""An unchanged TOASTed value survives the background cleaner: a ~200 KB text that never changes,
300 UPDATEs of another column (each carrying the placeholder for it), then compaction drops the
records that held the value — the kept record must hold it instead (the database is the oracle)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pyarrow.parquet as pq
import pytest

from tests import waiting
from tests.integration.capture.helpers import cli, records, spawn_capture, wait_for
from tributary.capture.decoding.values import UNAVAILABLE
from tributary.eventstore.migrate import run_migrations
from tributary.log.local import Log
from tributary.log.local.cleaner import read_checkpoint

pytestmark = pytest.mark.integration

TOPIC = "shop.public.doc"
KEYS = (1, 2)  # 1: read by the snapshot, 2: inserted while streaming


def _config(path: Path, *, dsn: str, root: Path) -> Path:
    run_migrations(dsn)
    path.write_text(
        f"""
[service]
dsn = "{dsn}"

[log]
root = "{root}"
partitions = 2
segment_bytes = 4096
linger_ms = 2
cleaner_interval_s = 0.3
min_cleanable_dirty_ratio = 0.3
file_delete_delay_ms = 500

[capture]
status_interval_s = 1.0
max_backoff_s = 2.0
capture_eventstore = false

[[sources]]
name = "shop"
dsn = "{dsn}"
slot = "slot_toast_{abs(hash(str(root))) % 100000}"
include = ["public.*"]
"""
    )
    return path


def _rows(dsn: str) -> dict[bytes, dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, n, body FROM doc ORDER BY id").fetchall()
    return {b'{"id":%d}' % i: {"id": i, "n": n, "body": body} for i, n, body in rows}


def _latest(root: Path) -> dict[bytes, Any]:
    """Each key's latest record (raw, nothing resolved)."""
    return {r.key: r for r in records(root, TOPIC) if r.key is not None and r.key.startswith(b'{"id"')}


def _compacted_past(root: Path, latest: dict[bytes, Any]) -> bool:
    """A cleaner pass has compacted every segment holding a key's latest record."""
    parts = read_checkpoint(root).get("partitions", {})
    return all(parts.get(f"{TOPIC}/{r.partition}", {}).get("clean_end", 0) > r.offset for r in latest.values())


def test_unchanged_toast_value_survives_background_compaction(fresh_db: str, tmp_path: Path) -> None:
    big = "SELECT string_agg(md5(g::text || %s), '') FROM generate_series(1, 6400) g"  # 204,800 chars
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE doc (id int PRIMARY KEY, n int NOT NULL, body text)")
        conn.execute("ALTER TABLE doc ALTER body SET STORAGE EXTERNAL")  # out of line, uncompressed
        conn.execute(f"INSERT INTO doc VALUES (1, 0, ({big}))", ("a",))
    root = tmp_path / "log"
    config = _config(tmp_path / "t.toml", dsn=fresh_db, root=root)
    proc = spawn_capture(config)
    try:
        wait_for(lambda: (root / "manifest.json").exists(), 60, "the log", progress=lambda: waiting.size_of(root))
        wait_for(lambda: len(_latest(root)) == 1, 60, "the snapshot", progress=lambda: waiting.size_of(root))
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute(f"INSERT INTO doc VALUES (2, 0, ({big}))", ("b",))
            for i in range(300):
                conn.execute("UPDATE doc SET n = %s WHERE id = %s", (i + 1, KEYS[i % 2]))
        want = _rows(fresh_db)
        assert all(len(want[b'{"id":%d}' % k]["body"]) == 204_800 for k in KEYS)

        def caught_up() -> bool:
            latest = _latest(root)
            return all(k in latest and orjson.loads(latest[k].value)["after"]["n"] == want[k]["n"] for k in want)

        wait_for(caught_up, 120, "capture to catch up", progress=lambda: waiting.size_of(root))
        ours = _latest(root)
        # other keys roll the segments on until the cleaner has compacted past 1's and 2's latest
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("INSERT INTO doc SELECT g, 0, 'small' FROM generate_series(3, 20) g")
            updates = [0]

            def compacted() -> bool:
                if _compacted_past(root, ours):
                    return True
                for _ in range(20):
                    updates[0] += 1
                    conn.execute("UPDATE doc SET n = %s WHERE id = %s", (updates[0], 3 + updates[0] % 18))
                return False

            waiting.wait_progress(  # the cleaner's clean ends move on pass by pass
                compacted,
                lambda: str(read_checkpoint(root).get("partitions", {})),
                what="the cleaner to compact past the records",
                poll=0.1,
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err

    held = [r for r in records(root, TOPIC) if r.key in ours]
    assert sorted(r.key for r in held) == sorted(ours), "compaction kept one record per key"
    for r in held:  # the kept record holds the real value, equal to the table's row
        after = orjson.loads(r.value)["after"]
        assert after["body"] != UNAVAILABLE
        assert after == want[r.key], r.key
        assert r.offset == ours[r.key].offset  # the offset stays

    res = cli("log", "cat", TOPIC, "--compacted", "--config", str(tmp_path / "t.toml"))
    assert res.returncode == 0, res.stderr
    lines = [orjson.loads(line) for line in res.stdout.splitlines()]
    shown = {orjson.dumps(d["key"]): d["value"].get("after") for d in lines}  # schema records have none
    for k in ours:
        assert shown[k] == want[k]

    with Log.open(root, writer=True) as log:  # the Parquet copy of a compacted segment has it too
        log.write_parquet(TOPIC)
    for r in held:
        pdir = root / TOPIC / str(r.partition)
        copies = [pq.read_table(p).to_pylist() for p in pdir.glob("*.parquet")]
        rows = [row for table in copies for row in table if row["offset"] == r.offset]
        assert len(rows) == 1 and orjson.loads(rows[0]["value"])["after"] == want[r.key]


def test_init_on_kafka_warns_about_tables_whose_unchanged_values_compaction_can_lose(fresh_db: str) -> None:
    from tributary.capture.prerequisites import Outcome, check_source
    from tributary.capture.spec import SourceSpec

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE doc (id int PRIMARY KEY, n int, body text)")
        conn.execute("CREATE TABLE full_doc (id int PRIMARY KEY, body jsonb)")
        conn.execute("ALTER TABLE full_doc REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE counts (id text PRIMARY KEY, n bigint, at timestamptz)")  # nothing TOAST-able
    spec = SourceSpec("shop", fresh_db, "slot_toast_init", ("public.*",), (), "initial", 1)
    warned = [
        f.message
        for kafka in (False, True)
        for f in check_source(spec, create_slot=False, kafka=kafka).findings
        if f.outcome is Outcome.WARNING
    ]
    assert warned == [
        'on Kafka, compaction can leave an unchanged large value only as "__tributary_unavailable__" in '
        "public.doc: set REPLICA IDENTITY FULL on them to capture it whole (docs/kafka.md)"
    ]
