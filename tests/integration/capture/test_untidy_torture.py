"""Every untidy case at once, end to end, with the database as the oracle.

Two sources (a UTF-8 database whose own settings would change how values print, and a LATIN1
one), partitioned tables, replica identities other than the primary key, a keyless table under
FULL identity, a key added after `CREATE TABLE AS`, odd identifiers, large unchanged TOAST values
under compaction, rewriting DDL with `resnapshot_on_rewrite`, a rename, a partition truncated, a
requested re-snapshot, capture killed -9 twice mid-stream, and at the end the slot recreated behind
capture's back (`snapshot = "when_needed"`). After capture catches up, the latest record per key
of every table's topic equals the table, and each committed insert of an append-only ledger
appears exactly once."""

from __future__ import annotations

import math
import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql

from tests.integration.capture.helpers import capture_progress, cli, records, spawn_capture, table_state, wait_for
from tests.pg import PgServer
from tributary.capture.decoding.values import UNAVAILABLE
from tributary.capture.records.routing import topic_name
from tributary.capture.status import read_status

pytestmark = pytest.mark.integration

BIG = "x" * 200_000


@contextmanager
def _database(server: PgServer, encoding: str, settings: dict[str, str]) -> Iterator[str]:
    name = f"torture_{encoding.lower()}_{uuid.uuid4().hex[:8]}"
    with server.admin() as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
                sql.Identifier(name), sql.Literal(encoding)
            )
        )
        for key, value in settings.items():
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET {} = {}").format(sql.Identifier(name), sql.SQL(key), sql.Literal(value))
            )
    try:
        yield server.dsn(name)
    finally:
        server.drop_database(name)


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True, options="-c client_encoding=UTF8") as conn:
        for s in statements:
            conn.execute(s)


def _json(value: Any) -> Any:
    """A value as the envelope spells it, for the plain types these tables use."""
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, date | datetime):
        return value.isoformat()
    return value


def _table(dsn: str, qualified: str) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, options="-c client_encoding=UTF8") as conn:
        cur = conn.cursor(binary=True)
        rows = cur.execute(f"SELECT * FROM {qualified}").fetchall()
        names = [d.name for d in cur.description or []]
    return sorted(({n: _json(v) for n, v in zip(names, r, strict=True)} for r in rows), key=_canonical)


def _canonical(row: dict[str, Any]) -> bytes:
    return orjson.dumps(row, option=orjson.OPT_SORT_KEYS)


def _fold(log: Path, topic: str) -> list[dict[str, Any]]:
    """A consumer's table: upserts and deletes, an unchanged TOAST value (the placeholder) taken
    from the key's previous row."""
    state: dict[bytes, dict[str, Any]] = {}
    for rec in records(log, topic):
        if rec.key is None or rec.value is None:
            if rec.key is not None:
                state.pop(rec.key, None)
            continue
        value = orjson.loads(rec.value)
        if value.get("op") in ("c", "r", "u"):
            before = state.get(rec.key, {})
            state[rec.key] = {k: before.get(k, v) if v == UNAVAILABLE else v for k, v in value["after"].items()}
        elif value.get("op") == "d":
            state.pop(rec.key, None)
    return sorted(state.values(), key=_canonical)


SHOP = (
    "CREATE TABLE kv (id int PRIMARY KEY, n int, big text, b bytea, f float8)",
    "ALTER TABLE kv ALTER COLUMN big SET STORAGE EXTERNAL",
    f"INSERT INTO kv SELECT g, 0, CASE WHEN g <= 2 THEN '{BIG}' || g ELSE 'small' END, "
    "'\\x00ff'::bytea || g::text::bytea, CASE WHEN g % 2 = 0 THEN '-0'::float8 ELSE g / 3.0 END "
    "FROM generate_series(1, 20) g",
    "CREATE TABLE meas (id int, ts date, v text, PRIMARY KEY (id, ts)) PARTITION BY RANGE (ts)",
    "CREATE TABLE meas_2024 PARTITION OF meas FOR VALUES FROM ('2024-01-01') TO ('2025-01-01')",
    "CREATE TABLE meas_2025 PARTITION OF meas FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')",
    "INSERT INTO meas SELECT g, DATE '2024-06-01' + g * 20, 'v' || g FROM generate_series(1, 20) g",
    "CREATE TABLE ri (id int PRIMARY KEY, code text NOT NULL UNIQUE, v text)",
    "ALTER TABLE ri REPLICA IDENTITY USING INDEX ri_code_key",
    "INSERT INTO ri SELECT g, 'c' || g, 'v' FROM generate_series(1, 20) g",
    "CREATE TABLE rf (id int PRIMARY KEY, v text)",
    "ALTER TABLE rf REPLICA IDENTITY FULL",
    "INSERT INTO rf SELECT g, 'v' FROM generate_series(1, 20) g",
    "CREATE TABLE nk (a int, b text)",
    "ALTER TABLE nk REPLICA IDENTITY FULL",
    "INSERT INTO nk SELECT g, 'b' || g FROM generate_series(1, 20) g",
    'CREATE SCHEMA "Odd Schema"',
    'CREATE TABLE "Odd Schema"."tablé $1" (id int PRIMARY KEY, v text)',
    'INSERT INTO "Odd Schema"."tablé $1" SELECT g, \'ü\' || g FROM generate_series(1, 20) g',
    "CREATE TABLE rw (id int PRIMARY KEY, amount int)",
    "INSERT INTO rw SELECT g, g FROM generate_series(1, 20) g",
    "CREATE TABLE rn (id int PRIMARY KEY, v text)",
    "INSERT INTO rn SELECT g, 'r' || g FROM generate_series(1, 20) g",
    "CREATE TABLE ledger (id bigserial PRIMARY KEY, n int)",
)


def _workload(round_: int) -> tuple[str, ...]:
    """One round of ordinary changes over every table (not the ledger)."""
    r = round_
    return (
        f"UPDATE kv SET n = n + 1 WHERE id % 3 = {r % 3}",
        f"UPDATE meas SET v = 'r{r}' WHERE id % 4 = {r % 4}",
        f"INSERT INTO meas VALUES ({100 + r}, '2024-0{1 + r % 9}-02', 'new'), ({200 + r}, '2025-03-0{1 + r % 9}', 'new')",
        f"DELETE FROM meas WHERE id = {1 + r}",
        f"UPDATE ri SET v = 'r{r}' WHERE id = {1 + r}",
        f"UPDATE ri SET code = 'k{r}' WHERE id = {10 + r}",
        f"UPDATE rf SET v = 'r{r}' WHERE id <= {r + 1}",
        f"DELETE FROM rf WHERE id = {20 - r}",
        f"UPDATE nk SET b = b || '{r}' WHERE a = {1 + r}",
        f"DELETE FROM nk WHERE a = {20 - r}",
        f'UPDATE "Odd Schema"."tablé $1" SET v = \'é{r}\' WHERE id = {1 + r}',
        f"UPDATE rw SET amount = amount + 1 WHERE id = {1 + r}",
    )


def _ledger(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for i in range(n):
            conn.execute("INSERT INTO ledger (n) VALUES (%s)", (i,))


def _config(path: Path, log: Path, shop: str, legacy: str, snapshot: str = "initial") -> Path:
    path.write_text(
        f"""
[log]
root = "{log}"
partitions = 3
linger_ms = 2
segment_bytes = 65536
cleaner_interval_s = 0.5
min_cleanable_dirty_ratio = 0.1

[capture]
status_interval_s = 1.0
max_backoff_s = 2.0
capture_eventstore = false

[[sources]]
name = "shop"
dsn = "{shop}"
slot = "torture_shop_{abs(hash(str(log))) % 100000}"
include = ["public.*", "Odd Schema.*"]
snapshot = "{snapshot}"
resnapshot_on_rewrite = true

[[sources]]
name = "legacy"
dsn = "{legacy}"
slot = "torture_legacy_{abs(hash(str(log))) % 100000}"
include = ["public.*"]
snapshot = "{snapshot}"
"""
    )
    return path


def _streaming(log: Path) -> bool:
    sources = (read_status(log) or {}).get("sources") or []
    return len(sources) == 2 and all(s.get("state") == "streaming" for s in sources)


def _ledger_seen(log: Path) -> int:
    return len(_streamed_once(log, "shop.public.ledger"))


def _streamed_once(log: Path, topic: str) -> Counter[bytes]:
    """How often each key of an append-only topic was created by the stream (op c)."""
    seen: Counter[bytes] = Counter()
    for rec in records(log, topic):
        if rec.value and rec.key and b'"op":"c"' in rec.value:
            seen[rec.key] += 1
    return seen


def _differences(log: Path, shop: str, legacy: str, odd: str) -> list[str]:
    """The tables whose topic's fold differs from them (empty: the database agrees with the log)."""
    tables = [(shop, q, f"shop.public.{q}") for q in ("kv", "meas", "ri", "rf", "nk", "c", "rw", "rn2", "ledger")] + [
        (shop, '"Odd Schema"."tablé $1"', odd),
        (legacy, "people", "legacy.public.people"),
    ]
    return [q for dsn, q, topic in tables if _fold(log, topic) != _table(dsn, q)]


def test_every_untidy_case_at_once_equals_the_database(pg_server: PgServer, tmp_path: Path) -> None:
    settings = {"bytea_output": "escape", "DateStyle": "SQL, DMY", "extra_float_digits": "0"}
    with _database(pg_server, "UTF8", settings) as shop, _database(pg_server, "LATIN1", {}) as legacy:
        _sql(shop, *SHOP)
        _sql(legacy, "CREATE TABLE people (id int PRIMARY KEY, name text)")
        _sql(legacy, "INSERT INTO people SELECT g, 'Zoë ' || g || ' ÿ' FROM generate_series(1, 20) g")
        log = tmp_path / "log"
        config = _config(tmp_path / "t.toml", log, shop, legacy)
        init = cli("init", "--config", str(config))
        assert init.returncode == 0, init.stdout + init.stderr
        odd = topic_name("shop", "Odd Schema", "tablé $1")
        assert odd in init.stdout and "keyed by the whole row" in init.stdout

        capture = spawn_capture(config)
        try:
            wait_for(lambda: _streaming(log), 300, "both sources to stream", progress=lambda: capture_progress(log))
            for round_ in range(3):
                _sql(shop, *_workload(round_))
                _sql(legacy, f"UPDATE people SET name = name || 'é' WHERE id = {1 + round_}")
                _ledger(shop, 30)
            wait_for(lambda: _ledger_seen(log) >= 30, 300, "capture to stream", progress=lambda: capture_progress(log))
            capture.send_signal(signal.SIGKILL)  # mid-stream: its uncommitted appends go
            capture.wait(60)

            # While it is down: a table made by CREATE TABLE AS (keyed by the whole row).
            _sql(shop, "CREATE TABLE c AS SELECT g AS id, 'x' || g AS v FROM generate_series(1, 30) g")
            _sql(shop, "ALTER TABLE c REPLICA IDENTITY FULL")
            _ledger(shop, 30)
            capture = spawn_capture(config)
            wait_for(lambda: _ledger_seen(log) >= 120, 300, "capture to resume", progress=lambda: capture_progress(log))
            # While it streams: a key added, rewriting DDL, a rename, a truncated partition.
            _sql(
                shop,
                "ALTER TABLE c ADD PRIMARY KEY (id)",
                "UPDATE c SET v = 'y' WHERE id <= 5",
                "ALTER TABLE rw ALTER COLUMN amount TYPE bigint USING amount * 10",
                "ALTER TABLE rw ADD COLUMN note text DEFAULT 'n'",
                "ALTER TABLE rn RENAME TO rn2",
                "TRUNCATE meas_2024",
                "INSERT INTO meas VALUES (300, '2024-05-05', 'after truncate')",
            )
            for round_ in range(3, 6):
                _sql(shop, *_workload(round_))
                _ledger(shop, 30)
            wait_for(
                lambda: len(table_state(log, "shop.public.rn2")) == 20,
                300,
                "the renamed table's snapshot",
                progress=lambda: capture_progress(log),
            )
            capture.send_signal(signal.SIGKILL)
            capture.wait(60)

            capture = spawn_capture(config)
            requested = cli("capture", "snapshot", "public.ri", "--config", str(config), "--source", "shop")
            assert requested.returncode == 0, requested.stderr
            for round_ in range(6, 8):
                _sql(shop, *_workload(round_))
                _ledger(shop, 30)
            wait_for(
                lambda: _ledger_seen(log) >= 270, 300, "every ledger insert", progress=lambda: capture_progress(log)
            )
            # Caught up (re-snapshots of the key change, the rewrite, the truncate and the request
            # included): every topic equals its table, before anything else re-states them.
            try:
                wait_for(
                    lambda: _differences(log, shop, legacy, odd) == [],
                    120,
                    "every topic to equal its table",
                    progress=lambda: capture_progress(log),
                )
            except AssertionError:
                diff = _differences(log, shop, legacy, odd)
                detail = {q: (_fold(log, f"shop.public.{q}"), _table(shop, q)) for q in diff if q.isidentifier()}
                raise AssertionError(f"{diff}: {detail}") from None
            capture.send_signal(signal.SIGTERM)
            assert capture.wait(120) == 0
        finally:
            if capture.returncode is None:
                capture.send_signal(signal.SIGKILL)
                capture.wait(60)

        # Across two kill -9s, each committed insert was streamed once (before anything re-states it).
        ledger = _streamed_once(log, "shop.public.ledger")
        assert len(ledger) == 270 and set(ledger.values()) == {1}, Counter(ledger.values())

        # The slot made again behind capture's back, with changes in between: when_needed re-snapshots.
        slot = f"torture_shop_{abs(hash(str(log))) % 100000}"
        _sql(shop, f"SELECT pg_drop_replication_slot('{slot}')")
        _sql(shop, "DELETE FROM rf WHERE id = 1", "UPDATE ri SET v = 'gap' WHERE id = 2")
        _sql(shop, f"SELECT pg_create_logical_replication_slot('{slot}', 'wal2json')")
        _config(tmp_path / "t.toml", log, shop, legacy, snapshot="when_needed")
        last = cli("capture", "--config", str(config), "--until-idle", "3", timeout=900)
        assert last.returncode == 0, last.stderr
        compact = cli("log", "compact", "--config", str(config))
        assert compact.returncode == 0, compact.stderr

        assert _differences(log, shop, legacy, odd) == []
        assert table_state(log, "shop.public.rn") == {}  # the renamed table's old topic ended
        assert not any(p.name.startswith("shop.public.meas_") for p in log.iterdir())
        kv = {row["id"]: row for row in _fold(log, "shop.public.kv")}
        assert kv[1]["big"] == BIG + "1" and math.copysign(1.0, kv[2]["f"]) == -1.0
