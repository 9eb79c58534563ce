"""A rebuild's COPY into its new build table: the primary key is added after the rows (one sorted
index build), keeps its name, and still refuses two rows with one key; a table readers are
served from keeps its key throughout."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tributary.projections.definition import Projection, Table
from tributary.projections.store import BuildRow, Store

pytestmark = pytest.mark.integration

PROJECTION = Projection(
    name="totals",
    version=1,
    topics=("events.account",),
    table=Table.of({"account_id": "text", "events": "bigint"}, ["account_id"]),
    build=lambda df: df,
)


def _key(conn: psycopg.Connection[Any], b: BuildRow) -> tuple[str, int, str] | None:
    """(constraint name, index oid, definition) of the build table's primary key."""
    row = conn.execute(
        "SELECT conname, conindid::bigint, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = %s::regclass AND contype = 'p'",
        (f'views."{b.table_name}"',),
    ).fetchone()
    return None if row is None else (row[0], row[1], row[2])


def _replace(store: Store, b: BuildRow, lines: bytes) -> int:
    return store.replace_rows(PROJECTION, b, [lines], {}, 0, distinct_keys=True)


@pytest.fixture
def conn(fresh_db: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(fresh_db, autocommit=True) as c:
        Store(c).ensure()
        yield c


def test_new_build_gets_its_key_after_the_copy(conn: psycopg.Connection[Any]) -> None:
    store = Store(conn)
    b = store.new_build(PROJECTION)
    before = _key(conn, b)
    assert before is not None
    assert _replace(store, b, b"a\t1\nb\t2\nc\t3\n") == 3
    after = _key(conn, b)
    assert after is not None
    assert (after[0], after[2]) == (before[0], before[2]) == (before[0], "PRIMARY KEY (account_id)")
    assert after[1] != before[1]  # a new index, built over the copied rows
    assert conn.execute(f'SELECT count(*) FROM views."{b.table_name}"').fetchone() == (3,)


def test_duplicate_keys_are_still_refused(conn: psycopg.Connection[Any]) -> None:
    store = Store(conn)
    b = store.new_build(PROJECTION)
    before = _key(conn, b)
    with pytest.raises(psycopg.errors.UniqueViolation):
        _replace(store, b, b"a\t1\nb\t2\na\t3\n")
    assert _key(conn, b) == before  # rolled back: the key as it was, no rows
    assert conn.execute(f'SELECT count(*) FROM views."{b.table_name}"').fetchone() == (0,)
    store.swap(b)
    assert _replace(store, b, b"a\t1\n") == 1


def test_a_served_table_keeps_its_key(conn: psycopg.Connection[Any]) -> None:
    store = Store(conn)
    b = store.new_build(PROJECTION)
    store.swap(b)
    before = _key(conn, b)
    assert _replace(store, b, b"a\t1\n") == 1
    assert _key(conn, b) == before  # readers may hold the table: no ALTER TABLE on it
