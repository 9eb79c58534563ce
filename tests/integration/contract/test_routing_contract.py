"""Topic routing (`[[sources.routes]]`, Debezium's ByLogicalTableRouter) on every log backend: two
shard tables with the same ids routed into one topic keep distinct keys (the key field names each
row's table), through the snapshot, streamed changes (a multi-row INSERT transaction included), a
chunked re-snapshot of one shard, and a TRUNCATE of one shard: the topic, folded by key, equals the
union of the two tables, and the other shard's rows survive both."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.backends import LogBackend, changes, table_state, write_backend_config
from tests.integration.capture.helpers import capture_progress, source_status, spawn_capture, wait_for
from tributary.capture.status import STATUS_FILE, snapshot_view

pytestmark = pytest.mark.integration

SHARDS = ("shard_1", "shard_2")
ROUTES = """
[[sources.routes]]
tables = "public.shard_*"
topic = "{source}.orders"
"""


def _union(dsn: str) -> dict[str, dict[str, Any]]:
    """Both shards' rows, keyed as the routed topic keys them: the id and the shard's own topic."""
    out: dict[str, dict[str, Any]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for shard in SHARDS:
            for row_id, v in conn.execute(f"SELECT id, v FROM {shard}"):
                key = {"id": row_id, "__dbz__physicalTableIdentifier": f"shop.public.{shard}"}
                out[orjson.dumps(key, option=orjson.OPT_SORT_KEYS).decode()] = {"id": row_id, "v": v}
    return out


def _snapshot_records(backend: LogBackend, log_root: Path, shard: str, op: str) -> int:
    """How many records of the snapshot (a read, or a key check's delete) of `shard` the topic holds."""
    found = changes(backend.records(log_root, "shop.orders"))
    return sum(
        1 for c in found if c["op"] == op and c["source"]["table"] == shard and c["source"]["snapshot"] != "false"
    )


def _settle(dsn: str, log_root: Path, pid: int, marker: int, fold: Callable[[], dict[str, Any]]) -> None:
    """Once a status written from now on shows no snapshot under way (its key check's deletes are
    staged), a row of shard_1 committed after them; back when the topic holds it."""
    status_file = log_root / STATUS_FILE
    since = status_file.stat().st_mtime_ns
    wait_for(
        lambda: status_file.stat().st_mtime_ns > since and snapshot_view(source_status(log_root, pid)) is None,
        what="the snapshot done",
        progress=lambda: capture_progress(log_root),
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO shard_1 VALUES (%s, 'marker')", (marker,))
    key = orjson.dumps({"__dbz__physicalTableIdentifier": "shop.public.shard_1", "id": marker}).decode()
    wait_for(lambda: key in fold(), what="a row after the snapshot", progress=lambda: capture_progress(log_root))


def test_two_shards_routed_into_one_topic_keep_their_keys_apart(
    fresh_db: str, tmp_path: Path, backend: LogBackend
) -> None:
    backend.prepare("shop.orders")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.tributary_signal (id text PRIMARY KEY, type text NOT NULL, data text)")
        for shard in SHARDS:
            conn.execute(f"CREATE TABLE {shard} (id int PRIMARY KEY, v text NOT NULL)")
            conn.execute(f"INSERT INTO {shard} SELECT i, '{shard}-' || i FROM generate_series(1, 300) i")
    log_root = tmp_path / "log"
    extra = f'signal_table = "public.tributary_signal"\nsnapshot_chunk_rows = 100\n{ROUTES}'
    config = write_backend_config(backend, tmp_path / "t.toml", dsn=fresh_db, log_root=log_root, source_extra=extra)
    proc = spawn_capture(config)
    progress = lambda: capture_progress(log_root)  # noqa: E731
    fold = lambda: table_state(backend.records(log_root, "shop.orders"))  # noqa: E731
    try:
        wait_for(lambda: source_status(log_root, proc.pid).get("state") == "streaming", progress=progress)
        assert fold() == _union(fresh_db), "the snapshot: both shards, 600 keys"
        assert len(fold()) == 600

        with psycopg.connect(fresh_db, autocommit=True) as conn:
            with conn.transaction():  # a run of INSERTs in one transaction: the INSERT fast path's case
                for shard in SHARDS:
                    conn.execute(f"INSERT INTO {shard} SELECT i, 'new-' || i FROM generate_series(301, 340) i")
            conn.execute("UPDATE shard_1 SET v = 'changed' WHERE id = 1")
            conn.execute("DELETE FROM shard_2 WHERE id = 2")
            conn.execute("UPDATE shard_2 SET id = 1002 WHERE id = 3")  # a key change
        want = _union(fresh_db)
        wait_for(lambda: fold() == want, what="the streamed changes", progress=progress)

        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute(
                """INSERT INTO tributary_signal VALUES ('1', 'execute-snapshot', '{"tables": ["public.shard_2"]}')"""
            )
        rows_2 = len([k for k in want if "shard_2" in k])
        wait_for(
            lambda: _snapshot_records(backend, log_root, "shard_2", "r") >= 300 + rows_2,
            what="the re-snapshot of shard_2",
            progress=progress,
        )
        _settle(fresh_db, log_root, proc.pid, 1001, fold)
        assert fold() == _union(fresh_db), "a re-snapshot of one shard leaves the other's rows alone"

        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("TRUNCATE shard_2")
            conn.execute("INSERT INTO shard_2 VALUES (7, 'after truncate')")
        wait_for(
            lambda: _snapshot_records(backend, log_root, "shard_2", "d") >= rows_2 - 1,  # all but 7, inserted again
            what="the truncate of shard_2",
            progress=progress,
        )
        _settle(fresh_db, log_root, proc.pid, 1002, fold)
        want = _union(fresh_db)
        assert fold() == want, "a truncate of one shard deletes its keys only"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.err_path.read_text()
    assert len([k for k in want if "shard_1" in k]) == 342, "shard_1 whole after shard_2's re-snapshot and truncate"
    found = changes(backend.records(log_root, "shop.orders"))
    assert "t" not in {c["op"] for c in found}, "a routed table's truncate is its keys' deletes, not a topic's"
    assert backend.records(log_root, "shop.public.shard_1") == [] == backend.records(log_root, "shop.public.shard_2")
