"""Column and row rules (`[[sources.rules]]`, capture/records/rules.py) end to end on a real PostgreSQL,
on every log backend, under a consistent and a chunked snapshot: the snapshot, the stream and a
re-snapshot (after a lost slot) give each table's topic the rows its filter keeps, with excluded
columns gone and masked, hashed and truncated values as configured (a hashed key column hashed in
the key too); rows moved out of the filter are deleted, rows moved in created; and no raw value of
an excluded or masked column is anywhere under the log root, in the records or in capture's output."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.backends import LogBackend, changes, table_state, write_backend_config
from tests.integration.capture.helpers import cli
from tests.integration.capture.test_resnapshot import _slot

pytestmark = pytest.mark.integration

SALT = "pepper-7"
RULES = f"""
[[sources.rules]]
tables = ["public.cust*"]
exclude = ["ssn"]
mask = ["card"]
mask_chars = 6
hash = ["email"]
hash_salt = "{SALT}"
truncate = ["bio"]
truncate_chars = 5
row_filter = "status = 'open' and region in ('eu', 'uk')"

[[sources.rules]]
tables = ["public.accounts"]
hash = ["acct"]
hash_salt = "{SALT}"
"""
DDL = [
    "CREATE TABLE customers (id int PRIMARY KEY, email text, ssn text, card text, bio text, status text, region text)",
    "ALTER TABLE customers REPLICA IDENTITY FULL",
    "CREATE TABLE accounts (acct text PRIMARY KEY, owner text)",
    "CREATE TABLE plain (id int PRIMARY KEY, ssn text)",
]
FILL = [
    "INSERT INTO customers SELECT g, 'user' || g || '@example.org', 'SSN-' || (100000 + g), 'CARD-4111-' || g, "
    "'BIOGRAPHY-' || g, CASE WHEN g % 3 = 0 THEN 'closed' ELSE 'open' END, CASE WHEN g % 4 = 0 THEN 'us' ELSE 'eu' END "
    "FROM generate_series(1, {n}) g",
    "INSERT INTO accounts SELECT 'ACCT-SECRET-' || g, 'owner' || g FROM generate_series(1, {n}) g",
    "INSERT INTO plain SELECT g, 'PLAIN-' || g FROM generate_series(1, 20) g",
]
# Raw values of excluded and masked columns, and of hashed ones: none may reach the log.
SECRETS = [b"SSN-1000", b"CARD-4111-", b"@example.org", b"ACCT-SECRET-", b"GRAPHY-"]


def _hash(value: str) -> str:
    return hashlib.sha256((SALT + value).encode()).hexdigest()


def _expected_customers(dsn: str) -> dict[str, dict[str, Any]]:
    """The customers table as its topic should fold: the rows the filter keeps, columns ruled."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, email, card, bio, status, region FROM customers").fetchall()
    out = {}
    for id_, email, card, bio, status, region in rows:
        if status == "open" and region in ("eu", "uk"):
            after = {"id": id_, "email": _hash(email), "card": "******" if card else None, "bio": bio and bio[:5]}
            out[orjson.dumps({"id": id_}).decode()] = after | {"status": status, "region": region}
    return out


def _expected_accounts(dsn: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT acct, owner FROM accounts").fetchall()
    return {orjson.dumps({"acct": _hash(a)}).decode(): {"acct": _hash(a), "owner": o} for a, o in rows}


def _capture(config: Path) -> str:
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stdout + res.stderr


def _check(backend: LogBackend, log_root: Path, dsn: str, output: str) -> None:
    """Each topic folds to its table under the rules, and no raw value is in the log or the output."""
    for topic in ("shop.public.customers", "shop.public.accounts"):
        for rec in backend.records(log_root, topic):
            for secret in SECRETS:
                assert secret not in (rec.key or b"") + (rec.value or b""), (topic, secret)
    for path in log_root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in SECRETS:
                assert secret not in data, f"{secret!r} in {path.relative_to(log_root)}"
    for secret in SECRETS:
        assert secret.decode() not in output
    customers = backend.records(log_root, "shop.public.customers")
    assert table_state(customers) == _expected_customers(dsn)
    assert table_state(backend.records(log_root, "shop.public.accounts")) == _expected_accounts(dsn)
    plain = table_state(backend.records(log_root, "shop.public.plain"))
    assert len(plain) == 20 and plain['{"id":1}']["ssn"] == "PLAIN-1", "a table without rules is as it was"


@pytest.mark.parametrize("method", ["consistent", "chunked"])
def test_rules_hold_in_snapshot_stream_and_resnapshot(
    fresh_db: str, tmp_path: Path, backend: LogBackend, method: str
) -> None:
    backend.prepare("shop.public.customers", "shop.public.accounts", "shop.public.plain")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for ddl in DDL:
            conn.execute(ddl)
        for fill in FILL:
            conn.execute(fill.format(n=600))
    extra = 'snapshot = "when_needed"'
    if method == "chunked":
        extra += '\nsnapshot_method = "chunked"\nsnapshot_chunk_rows = 250'
    log_root = tmp_path / "log"
    config = write_backend_config(
        backend, tmp_path / "t.toml", dsn=fresh_db, log_root=log_root, source_extra=extra, extra=RULES
    )
    out = _capture(config)
    _check(backend, log_root, fresh_db, out)
    first = backend.records(log_root, "shop.public.customers")
    assert {v["op"] for v in changes(first)} == {"r"}

    # The stream: rows moved out of the filter and into it, updates inside it, deletes, inserts.
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("UPDATE customers SET status = 'closed' WHERE id IN (1, 2)")  # in → out
        conn.execute("UPDATE customers SET status = 'open' WHERE id IN (3, 6)")  # out → in
        conn.execute("UPDATE customers SET bio = 'BIOGRAPHY-new', card = 'CARD-4111-x' WHERE id = 5")  # in → in
        conn.execute("UPDATE customers SET bio = 'BIOGRAPHY-still-out' WHERE id = 9")  # out → out
        conn.execute("DELETE FROM customers WHERE id IN (7, 12)")  # one in, one out
        conn.execute(FILL[0].replace("generate_series(1, {n})", "generate_series(1001, 1012)"))
        conn.execute("UPDATE accounts SET owner = 'someone' WHERE acct = 'ACCT-SECRET-1'")
        conn.execute("UPDATE accounts SET acct = 'ACCT-SECRET-new' WHERE acct = 'ACCT-SECRET-2'")
        conn.execute("DELETE FROM accounts WHERE acct = 'ACCT-SECRET-3'")
    out = _capture(config)
    _check(backend, log_root, fresh_db, out)
    seen = {(r.partition, r.offset) for r in first}
    streamed = changes(
        [r for r in backend.records(log_root, "shop.public.customers") if (r.partition, r.offset) not in seen]
    )
    ops: dict[int, list[str]] = {}
    for value in streamed:
        row = value["after"] or value["before"]
        ops.setdefault(row["id"], []).append(value["op"])
    assert ops[1] == ops[2] == ["d"], "an UPDATE out of the filter deletes the row's key"
    assert ops[3] == ops[6] == ["c"], "an UPDATE into the filter creates the row"
    assert ops[5] == ["u"] and 9 not in ops and 12 not in ops and ops[7] == ["d"]
    assert sorted(i for i in ops if i > 1000) == [i for i in range(1001, 1013) if i % 3 and i % 4]

    # A re-snapshot after a lost slot: rows gone or moved out of the filter meanwhile are deleted.
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (_slot(config),))
        conn.execute("UPDATE customers SET region = 'us' WHERE id IN (10, 11)")
        conn.execute("DELETE FROM customers WHERE id = 13")
        conn.execute("DELETE FROM accounts WHERE acct IN ('ACCT-SECRET-4', 'ACCT-SECRET-5')")
    before = set(table_state(backend.records(log_root, "shop.public.customers")))
    out = _capture(config)
    assert "taking a new snapshot" in out
    _check(backend, log_root, fresh_db, out)
    gone = before - set(_expected_customers(fresh_db))
    assert gone == {'{"id":10}', '{"id":11}', '{"id":13}'}
