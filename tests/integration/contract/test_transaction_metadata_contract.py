"""Transaction metadata (`transaction_metadata = true`) on every log backend, against a real
PostgreSQL: BEGIN and END records on `<source>.transactions` whose counts equal what each database
transaction changed, a `transaction` block on every streamed change (not on snapshot rows), and no
BEGIN without its END and its changes after `kill -9` at random moments."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.backends import LogBackend, changes, write_backend_config
from tests.integration.capture.helpers import capture_progress, cli, source_status, spawn_capture, wait_for
from tributary.log import Record

pytestmark = pytest.mark.integration

TABLES = ("public.orders", "public.lines")
SOURCE_EXTRA = "transaction_metadata = true"


def _topics(backend: LogBackend) -> None:
    backend.prepare("shop.transactions", "shop.public.orders", "shop.public.lines")


def _schema(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total int NOT NULL)")
        conn.execute("CREATE TABLE lines (id int PRIMARY KEY, order_id int NOT NULL, qty int NOT NULL)")
        conn.execute("INSERT INTO orders SELECT g, 0 FROM generate_series(1, 50) g")  # snapshot rows


def _workload(dsn: str) -> dict[int, Counter[str]]:
    """Transactions of known shape, each one's xid → its changed rows per table (as PostgreSQL
    counts them): small ones of every kind and one of 700 inserts (the INSERT fast path's size)."""
    want: dict[int, Counter[str]] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(1, 31):
            with conn.transaction():
                xid = conn.execute("SELECT txid_current() % 4294967296").fetchone()[0]  # type: ignore[index]
                counts: Counter[str] = Counter()
                counts["public.orders"] += conn.execute("INSERT INTO orders VALUES (%s, %s)", (1000 + i, i)).rowcount
                counts["public.lines"] += conn.execute(
                    "INSERT INTO lines SELECT g, %s, 1 FROM generate_series(%s::int, %s::int) g",
                    (1000 + i, i * 10, i * 10 + i % 4),
                ).rowcount
                if i % 3 == 0:
                    counts["public.orders"] += conn.execute(
                        "UPDATE orders SET total = total + 1 WHERE id <= %s", (i,)
                    ).rowcount
                if i % 5 == 0:
                    counts["public.lines"] += conn.execute("DELETE FROM lines WHERE id = %s", (i * 10,)).rowcount
            want[xid] = +counts
        with conn.transaction():
            xid = conn.execute("SELECT txid_current() % 4294967296").fetchone()[0]  # type: ignore[index]
            n = conn.execute("INSERT INTO lines SELECT g, 1, g FROM generate_series(100000, 100699) g").rowcount
            want[xid] = Counter({"public.lines": n})
        conn.execute("CREATE TABLE other (id int)")  # a transaction without changes: no BEGIN, no END
    return want


def _values(records: list[Record]) -> list[dict[str, Any]]:
    return [orjson.loads(r.value) for r in records if r.value is not None]


def _check_transactions(backend: LogBackend, log_root: Path) -> dict[str, dict[str, Any]]:
    """Every BEGIN has one END after it (same key, same partition), and each END's counts equal
    the changes that carry its id, numbered 1… in total and per table; returns the ENDs by id."""
    tx_records = backend.records(log_root, "shop.transactions")
    by_partition: defaultdict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in tx_records:
        value = orjson.loads(record.value)
        assert orjson.loads(record.key) == {"id": value["id"]}
        by_partition[record.partition].append(value)
    ends: dict[str, dict[str, Any]] = {}
    for values in by_partition.values():
        open_ids: set[str] = set()
        for value in values:
            if value["status"] == "BEGIN":
                assert value["id"] not in open_ids and value["id"] not in ends, f"BEGIN twice: {value}"
                assert value["event_count"] is None and value["data_collections"] is None
                open_ids.add(value["id"])
            else:
                assert value["status"] == "END" and value["id"] in open_ids, f"END without BEGIN: {value}"
                open_ids.discard(value["id"])
                ends[value["id"]] = value
        assert not open_ids, f"BEGIN without END: {open_ids}"
    events: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for table in TABLES:
        for change in changes(backend.records(log_root, f"shop.{table}")):
            if change["source"]["snapshot"] != "false":
                assert "transaction" not in change, "a snapshot row has no transaction"
                continue
            block = change["transaction"]
            assert block["id"].split(":")[0] == str(change["source"]["txId"])
            events[block["id"]].append(dict(block, table=table))
    assert events.keys() == ends.keys()
    for tx_id, got in events.items():
        end = ends[tx_id]
        assert sorted(e["total_order"] for e in got) == list(range(1, end["event_count"] + 1))
        per_table = {c["data_collection"]: c["event_count"] for c in end["data_collections"]}
        assert Counter(e["table"] for e in got) == per_table
        for table, n in per_table.items():
            assert sorted(e["data_collection_order"] for e in got if e["table"] == table) == list(range(1, n + 1))
    return ends


def test_begin_and_end_count_what_each_transaction_committed(
    fresh_db: str, tmp_path: Path, backend: LogBackend
) -> None:
    _topics(backend)
    _schema(fresh_db)
    log_root = tmp_path / "log"
    config = write_backend_config(
        backend, tmp_path / "t.toml", dsn=fresh_db, log_root=log_root, source_extra=SOURCE_EXTRA
    )
    proc = spawn_capture(config, "--until-idle", "3")
    wait_for(
        lambda: source_status(log_root, proc.pid).get("state") == "streaming",
        what="capture streaming",
        progress=lambda: capture_progress(log_root),
    )
    want = _workload(fresh_db)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    ends = _check_transactions(backend, log_root)
    got = {
        int(tx_id.split(":")[0]): Counter({c["data_collection"]: c["event_count"] for c in end["data_collections"]})
        for tx_id, end in ends.items()
    }
    assert got == want
    assert all(end["event_count"] == sum(want[int(i.split(":")[0])].values()) for i, end in ends.items())
    assert all(isinstance(end["ts_ms"], int) for end in ends.values())
    topics = cli("log", "topics", "--config", str(config))
    assert topics.returncode == 0, topics.stderr
    (line,) = [line for line in topics.stdout.splitlines() if "shop.transactions" in line]
    assert backend.name != "local" or "delete" in line, line  # retention: compaction would drop the BEGINs


def _writer(dsn: str, stop: threading.Event) -> None:
    """Transactions of 1–3 orders and 2 lines each, until `stop`."""
    rng = random.Random(7)
    with psycopg.connect(dsn, autocommit=True) as conn:
        i = 100
        while not stop.is_set():
            i += 1
            with conn.transaction():
                for j in range(rng.randint(1, 3)):
                    conn.execute("INSERT INTO orders VALUES (%s, %s)", (i * 10 + j, j))
                conn.execute("INSERT INTO lines VALUES (%s, %s, 1), (%s, %s, 2)", (i * 2, i, i * 2 + 1, i))
            time.sleep(0.001)


def test_kill_9_never_leaves_a_begin_without_its_changes(fresh_db: str, tmp_path: Path, backend: LogBackend) -> None:
    _topics(backend)
    _schema(fresh_db)
    log_root = tmp_path / "log"
    config = write_backend_config(
        backend, tmp_path / "t.toml", dsn=fresh_db, log_root=log_root, source_extra=SOURCE_EXTRA
    )
    first = cli("capture", "--config", str(config), "--until-idle", "1")  # the slot and the snapshot
    assert first.returncode == 0, first.stderr
    stop = threading.Event()
    writer = threading.Thread(target=_writer, args=(fresh_db, stop))
    writer.start()
    rng = random.Random(3)
    kills, shortest, longest = (8, 0.8, 2.0) if backend.name == "local" else (5, 1.5, 3.0)
    try:
        for _ in range(kills):
            proc = spawn_capture(config)
            time.sleep(rng.uniform(shortest, longest))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        stop.set()
        writer.join()
    final = cli("capture", "--config", str(config), "--until-idle", "2")
    assert final.returncode == 0, final.stderr
    ends = _check_transactions(backend, log_root)
    with psycopg.connect(fresh_db) as conn:
        orders = conn.execute("SELECT count(*) FROM orders WHERE id > 1000").fetchone()[0]  # type: ignore[index]
        lines = conn.execute("SELECT count(*) FROM lines").fetchone()[0]  # type: ignore[index]
    counted: Counter[str] = Counter()
    for end in ends.values():
        counted.update({c["data_collection"]: c["event_count"] for c in end["data_collections"]})
    assert counted == Counter({"public.orders": orders, "public.lines": lines})
