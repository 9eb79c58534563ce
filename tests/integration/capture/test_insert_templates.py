"""Streamed INSERTs through their templates (capture/streaming/insert_template.py) against the generic path,
on real wal2json output: the same topic, partition, offset, timestamp, key, value and headers for
every record, whatever the values and whatever else the transactions hold."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import waiting
from tests.integration.capture.test_snapshot_columnar import _COLUMNS, _INSERT, _KEY, _row
from tributary.capture import compiled
from tributary.capture.database.replication import XLogData, connect_options
from tributary.capture.database.slot import sql_connection
from tributary.capture.database.source_tables import SourceTables
from tributary.capture.decoding.wal2json import WAL2JSON_OPTIONS
from tributary.capture.records.routing import TableFilter
from tributary.capture.records.staging import Staging
from tributary.capture.source import SourceSession, SourceSpec
from tributary.capture.status import SourceStatus
from tributary.capture.streaming.positions import OffsetContext
from tributary.capture.streaming.stream import StreamingSource
from tributary.log.local import Log

pytestmark = pytest.mark.integration

_OPTIONS = [item for pair in WAL2JSON_OPTIONS.items() for item in pair]
_NOW = 1_700_000_000.25


def _documents(dsn: str, slot: str) -> list[bytes]:
    """Every wal2json document of the slot so far, with capture's options and session settings
    (the SQL interface runs the same plugin code as the replication stream)."""
    with psycopg.connect(dsn, autocommit=True, **connect_options()) as conn:
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_get_changes(%s, NULL, NULL, VARIADIC %s)", (slot, _OPTIONS)
        ).fetchall()
    return [row[0].encode() for row in rows]


@contextmanager
def _slot(dsn: str, slot: str) -> Iterator[None]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (slot,))
    try:
        yield
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def _capture(
    dsn: str, docs: list[bytes], root: Path, *, templates: bool, transaction_metadata: bool = False
) -> tuple[list[tuple[Any, ...]], int]:
    """Feed the documents to a streaming source (with or without templates) as the daemon would
    (commit at each boundary); every record of the resulting log, and how many changes the
    templates encoded."""
    with Log.open(root, writer=True, default_partitions=3) as log:
        spec = SourceSpec(
            name="shop",
            dsn=dsn,
            slot="unused",
            include=("public.*",),
            exclude=(),
            snapshot="never",
            partitions=3,
            transaction_metadata=transaction_metadata,
        )
        staging = Staging(log, partitions=spec.partitions)
        tables = SourceTables(spec.name, TableFilter(spec.include, spec.exclude), staging, schema_records=True)
        with sql_connection(dsn, label=spec.name) as conn:
            tables.seed(conn)  # as `SourceSession.open` does
            db = str(conn.info.dbname)
        offsets = OffsetContext()
        status = SourceStatus(name=spec.name, slot=spec.slot)
        stream = StreamingSource(spec, staging, tables, offsets, status, db=db, clock=lambda: _NOW, templates=templates)
        for doc in docs:
            if stream.handle(XLogData(0, 0, doc)):
                log.commit(positions={"shop": str(offsets.boundary)}, upto=log.mark())
                offsets.committed()
        assert not offsets.in_transaction
        assert stream.templates is None or not stream.templates.refused  # none disagreed with the generic path
        out = [
            (r.topic, r.partition, r.offset, r.timestamp, r.key, r.value, r.headers)
            for topic in sorted(log.topics())
            for p in range(log.topics()[topic].partitions)
            for r in log.read(topic, p)
        ]
        return out, stream.templated


def _compare(dsn: str, docs: list[bytes], tmp: Path, *, transaction_metadata: bool = False) -> tuple[int, int]:
    """Templates through the typed path (the default), through pure Python, and no templates:
    the same records (with transaction metadata: their `transaction` blocks, BEGIN and END too)."""
    assert compiled.encode_inserts is not None
    txmeta = transaction_metadata
    fast, templated = _capture(dsn, docs, tmp / "fast", templates=True, transaction_metadata=txmeta)
    with mock.patch.multiple(compiled, encode_inserts=None):
        python, templated_python = _capture(dsn, docs, tmp / "python", templates=True, transaction_metadata=txmeta)
    generic, none = _capture(dsn, docs, tmp / "generic", templates=False, transaction_metadata=txmeta)
    assert none == 0
    assert templated == templated_python
    assert fast == python == generic
    if txmeta:  # every change names its transaction, the templated INSERTs' too
        values = [orjson.loads(r[5]) for r in fast if r[0].startswith("shop.public.") and r[5]]
        changes = [v for v in values if "op" in v]
        assert changes and all("transaction" in c for c in changes)
        assert {v["status"] for r in fast if r[0] == "shop.transactions" for v in [orjson.loads(r[5])]} == {
            "BEGIN",
            "END",
        }
    return len(fast), templated


@pytest.mark.parametrize("transaction_metadata", [False, True], ids=["plain", "transaction_metadata"])
def test_mixed_transactions_are_byte_identical(fresh_db: str, tmp_path: Path, transaction_metadata: bool) -> None:
    rows = [
        (
            i,
            f"k{i % 5}",
            i,
            f'v "{i}" \\ é\n',
            "2024-01-02 03:04:05.123456+00",
            "1999-12-31 23:59:59",
            f"{i}.5",
            i % 2 == 0,
            b"\x00\x5c",
            None,
            "2024-02-29",
            "1 day",
            i % 100,
        )
        for i in range(1, 1201)
    ]
    odd = (9, "odd", None, "tab\tnew\u0001line", "infinity", "-infinity", "-0.000", None, None, None, None, None, None)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE t ({_COLUMNS}, {_KEY})")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY, f float8, j jsonb, a int[], big numeric)")
        conn.execute("CREATE TABLE nokey (x int, y text)")
        conn.execute("ALTER TABLE nokey REPLICA IDENTITY FULL")
    with _slot(fresh_db, "tpl"):
        with psycopg.connect(fresh_db) as conn, conn.cursor() as cur:
            cur.executemany(_INSERT.format(t="t"), rows[:700])  # one long transaction
            conn.commit()
            for chunk in (rows[700:701], rows[701:1000], rows[1000:]):  # inserts among other changes
                cur.executemany(_INSERT.format(t="t"), chunk)
                cur.execute(
                    "INSERT INTO other VALUES (%s, 0.1, '{\"a\": [1, 2.50]}', '{1,NULL}', 1e-30)", (len(chunk),)
                )
                cur.execute("INSERT INTO nokey VALUES (1, 'a'), (2, NULL)")
                cur.execute(_INSERT.format(t="t"), odd)
                cur.execute("UPDATE t SET b = 'changed' WHERE id = %s", (chunk[0][0],))
                cur.execute("UPDATE t SET id = -id WHERE id = %s", (chunk[-1][0],))  # a primary-key change
                cur.execute("DELETE FROM t WHERE id = -%s", (chunk[-1][0],))
                cur.execute("SELECT pg_logical_emit_message(true, 'p', 'm')")
                cur.execute("DELETE FROM t WHERE id = 9")
                conn.commit()
            cur.execute("ALTER TABLE t ADD COLUMN extra text DEFAULT 'x'")  # the shape changes mid-stream
            cur.executemany(
                'INSERT INTO t (id, "k ey", a, b, extra) VALUES (%s, %s, %s, %s, %s)',
                [(5000 + i, "z", i, "after", f"e{i}") for i in range(50)],
            )
            cur.execute("TRUNCATE other")
            conn.commit()
        docs = _documents(fresh_db, "tpl")
    records, templated = _compare(fresh_db, docs, tmp_path, transaction_metadata=transaction_metadata)
    inserts = sum(1 for d in docs if d.startswith(b'{"action":"I"'))
    assert records > inserts
    assert templated >= 0.9 * 1250  # the templates did the work, not the generic path


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_row, min_size=1, max_size=60), split=st.integers(0, 60))
def test_any_values_are_byte_identical(
    fresh_db: str, tmp_path_factory: pytest.TempPathFactory, rows, split: int
) -> None:
    seen: set[tuple[object, object]] = set()
    unique = [r for r in rows if (r[0], r[1]) not in seen and not seen.add((r[0], r[1]))]  # type: ignore[func-returns-value]
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS h; CREATE TABLE h ({_COLUMNS}, {_KEY})")
    with _slot(fresh_db, "hyp"):
        with psycopg.connect(fresh_db) as conn, conn.cursor() as cur:
            cur.execute("SET TimeZone = 'Asia/Kolkata'")  # the stream pins UTC whatever the writer's zone
            for part in (unique[:split], unique[split:]):
                if part:
                    cur.executemany(_INSERT.format(t="h"), part)
                    conn.commit()
        docs = _documents(fresh_db, "hyp")
    records, _ = _compare(fresh_db, docs, tmp_path_factory.mktemp("hyp"))
    assert records >= len(unique)


def _stream(dsn: str, slot: str, root: Path, *, held: bool, transactions: int) -> list[tuple[Any, ...]]:
    """Stream the slot through a real replication connection as the daemon does, the held INSERTs
    taken by the typed receive loop (`held`) or each message through `handle`; every record."""
    with Log.open(root, writer=True, default_partitions=3) as log:
        spec = SourceSpec(
            name="shop", dsn=dsn, slot=slot, include=("public.*",), exclude=(), snapshot="never", partitions=3
        )
        session = SourceSession(spec, log, clock=lambda: _NOW)
        session.open()
        stream = session.stream
        assert session.conn is not None and stream is not None
        try:

            def delivered() -> bool:
                assert session.conn is not None and stream is not None
                for message in session.conn.read(timeout=0.2, held=stream.held_run if held else None):
                    if stream.handle(message):
                        log.commit(positions={"shop": str(session.boundary)}, upto=log.mark())
                        session.committed()
                return bool(session.status.transactions >= transactions)

            waiting.wait_progress(  # (a stream that stops delivering stalls the count)
                lambda: session.status.transactions >= transactions or delivered(),
                lambda: session.status.transactions,
                what="the stream to deliver every transaction",
                poll=0,
            )
        finally:
            session.close()
        assert not session.in_transaction and stream.templated > 0
        return [
            (r.topic, r.partition, r.offset, r.timestamp, r.key, r.value, r.headers)
            for topic in sorted(log.topics())
            for p in range(log.topics()[topic].partitions)
            for r in log.read(topic, p)
        ]


def test_the_typed_receive_loop_holds_the_same_runs(fresh_db: str, tmp_path: Path) -> None:
    """`take_inserts` (INSERT documents straight from libpq onto the held run, full runs encoded
    at once) against every message through `handle`: the same records, on a real stream."""
    assert compiled.take_inserts is not None
    rows = [
        (i, "k", i, f"v{i}", "2024-01-02 03:04:05.5+00", None, f"{i}.5", True, None, None, None, None, 1)
        for i in range(1, 1001)
    ]
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE t ({_COLUMNS}, {_KEY})")
        conn.execute("CREATE TABLE other (id int PRIMARY KEY, f float8)")
        for slot in ("held", "handled"):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (slot,))
    with psycopg.connect(fresh_db) as conn, conn.cursor() as cur:
        cur.executemany(_INSERT.format(t="t"), rows[:450])  # runs of 200, 200 and 50
        conn.commit()
        for chunk in (rows[450:451], rows[451:700], rows[700:1000]):  # runs cut by other messages
            cur.executemany(_INSERT.format(t="t"), chunk[: len(chunk) // 2])
            cur.execute("INSERT INTO other VALUES (%s, 0.5)", (len(chunk),))
            cur.execute("SELECT pg_logical_emit_message(true, 'p', 'm')")
            cur.executemany(_INSERT.format(t="t"), chunk[len(chunk) // 2 :])
            cur.execute("UPDATE t SET b = 'changed' WHERE id = %s", (chunk[0][0],))
            conn.commit()
        cur.executemany(_INSERT.format(t="t"), [(5000 + i, *rows[0][1:]) for i in range(200)])  # exactly one run
        conn.commit()
    real = compiled.take_inserts
    taken: list[int] = []

    def counting(get: Any, run: list[bytes], room: int) -> Any:
        before = len(run)
        got = real(get, run, room)
        taken.append(len(run) - before)
        return got

    with mock.patch.object(compiled, "take_inserts", counting):
        held = _stream(fresh_db, "held", tmp_path / "held", held=True, transactions=5)
    handled = _stream(fresh_db, "handled", tmp_path / "handled", held=False, transactions=5)
    assert sum(taken) >= 1000  # the typed loop took (almost) every INSERT
    assert len(held) > 1200
    assert held == handled
