"""`api.pg_prepared.fetch` on a real PostgreSQL under uvloop: the same values as a cursor with the
same adapters, errors as a cursor raises them, statements prepared once per connection (and not
beyond the cap), NUL refused, and a cancelled or lost query leaves a connection the pool discards."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
import uvloop
from psycopg.adapt import AdaptersMap
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool

from api import pg_prepared
from api.pg_async import KeepReaderConnection

pytestmark = pytest.mark.integration

ADAPTERS = AdaptersMap(psycopg.adapters)
ADAPTERS.register_loader("numeric", TextLoader)

TYPED = (
    "SELECT CAST($1 AS bigint) AS i, CAST($2 AS numeric(12,2)) AS n, CAST($3 AS text) AS t, "
    "CAST($4 AS double precision) AS f, CAST($5 AS boolean) AS b, CAST($6 AS timestamptz) AS ts, "
    "CAST($7 AS date) AS d, CAST($8 AS jsonb) AS j, CAST($9 AS integer) AS z"
)


async def _connect(dsn: str) -> KeepReaderConnection:
    return await KeepReaderConnection.connect(dsn, autocommit=True)


def test_values_as_a_cursor_loads_them(fresh_db: str) -> None:
    params: list[Any] = [
        9007199254740993,
        "0.0000001",
        'quote " back \\ slash, é, ☃',
        1.5e-7,
        True,
        "2024-02-29 12:34:56.789+02",
        "2024-02-29",
        '{"a": [1, 2.5, null]}',
        None,
    ]
    query = TYPED.encode()
    cursor_query = (
        "SELECT "
        + ", ".join(
            f"CAST(%s AS {t})"
            for t in ("bigint", "numeric(12,2)", "text", "double precision", "boolean", "timestamptz", "date", "jsonb")
        )
        + ", CAST(%s AS integer)"
    )

    async def main() -> None:
        conn = await _connect(fresh_db)
        async with conn:
            cur = conn.cursor()
            cur.adapters.register_loader("numeric", TextLoader)
            await cur.execute(cursor_query, [None if p is None else str(p) for p in params])
            expected = await cur.fetchall()
            for _ in range(3):  # prepared on the first run, reused after
                got = await pg_prepared.fetch(conn, query, params, ADAPTERS, tuple)
                assert got == expected
            assert got[0][1] == "0.00"  # numeric(12,2) as PostgreSQL spells it, not a Decimal
            named = await (await conn.execute("SELECT count(*) FROM pg_prepared_statements")).fetchone()
            assert named == (1,)

    uvloop.run(main())


def test_many_rows_and_make_row(fresh_db: str) -> None:
    async def main() -> None:
        conn = await _connect(fresh_db)
        async with conn:
            rows = await pg_prepared.fetch(
                conn,
                b"SELECT g, md5(g::text) FROM generate_series(1, CAST($1 AS integer)) g",
                ["50000"],
                ADAPTERS,
                lambda r: {"g": r[0], "h": r[1]},
            )
            assert len(rows) == 50000 and rows[-1]["g"] == 50000 and len(rows[-1]["h"]) == 32
            assert await pg_prepared.fetch(conn, b"SELECT 1 WHERE false", [], ADAPTERS, tuple) == []

    uvloop.run(main())


def test_errors_as_a_cursor_raises_them_and_the_connection_stays_usable(fresh_db: str) -> None:
    async def main() -> None:
        conn = await _connect(fresh_db)
        async with conn:
            with pytest.raises(psycopg.errors.InvalidTextRepresentation):
                await pg_prepared.fetch(conn, b"SELECT CAST($1 AS bigint)", ["1; DROP TABLE x"], ADAPTERS, tuple)
            with pytest.raises(psycopg.errors.UndefinedTable):
                await pg_prepared.fetch(conn, b"SELECT * FROM views.nothing_here", [], ADAPTERS, tuple)
            with pytest.raises(psycopg.errors.DataError):  # libpq would cut the text at the NUL
                await pg_prepared.fetch(conn, b"SELECT CAST($1 AS text)", ["1\x00 OR true"], ADAPTERS, tuple)
            assert await pg_prepared.fetch(conn, b"SELECT CAST($1 AS bigint)", ["7"], ADAPTERS, tuple) == [(7,)]
            # the failed prepare was not remembered: the table appears, the same text now runs
            await conn.execute("CREATE SCHEMA IF NOT EXISTS views")
            await conn.execute("CREATE TABLE views.nothing_here AS SELECT 1 AS x")
            assert await pg_prepared.fetch(conn, b"SELECT * FROM views.nothing_here", [], ADAPTERS, tuple) == [(1,)]

    uvloop.run(main())


def test_prepares_up_to_the_cap_then_runs_unnamed(fresh_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_prepared, "MAX_PREPARED", 3)

    async def main() -> None:
        conn = await _connect(fresh_db)
        async with conn:
            for i in range(6):
                query = f"SELECT CAST($1 AS integer) + {i}".encode()
                for _ in range(2):
                    assert await pg_prepared.fetch(conn, query, ["1"], ADAPTERS, tuple) == [(1 + i,)]
            count = await (await conn.execute("SELECT count(*) FROM pg_prepared_statements")).fetchone()
            assert count == (3,)

    uvloop.run(main())


def test_cancelled_and_lost_queries_leave_connections_the_pool_discards(fresh_db: str) -> None:
    async def main() -> None:
        async with AsyncConnectionPool(
            fresh_db, min_size=1, max_size=2, kwargs={"autocommit": True}, connection_class=KeepReaderConnection
        ) as pool:
            conn = await pool.getconn()
            pid = conn.info.backend_pid
            query = asyncio.ensure_future(pg_prepared.fetch(conn, b"SELECT pg_sleep(30)", [], ADAPTERS, tuple))
            await asyncio.sleep(0.3)
            query.cancel()
            with pytest.raises(asyncio.CancelledError):
                await query
            await pool.putconn(conn)  # ACTIVE: the pool closes it
            conn = await pool.getconn()
            assert conn.info.backend_pid != pid
            assert await pg_prepared.fetch(conn, b"SELECT 2", [], ADAPTERS, tuple) == [(2,)]

            query = asyncio.ensure_future(pg_prepared.fetch(conn, b"SELECT pg_sleep(30)", [], ADAPTERS, tuple))
            await asyncio.sleep(0.3)
            with psycopg.connect(fresh_db, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
            with pytest.raises(psycopg.OperationalError):
                await asyncio.wait_for(query, 10)
            await pool.putconn(conn)
            async with pool.connection() as fresh:
                assert await pg_prepared.fetch(fresh, b"SELECT 3", [], ADAPTERS, tuple) == [(3,)]

    uvloop.run(main())


def test_a_view_swapped_for_one_of_other_column_types_is_prepared_again(fresh_db: str) -> None:
    """A projection's rebuild swaps its table for one whose columns may differ; PostgreSQL then
    refuses the prepared statement ("cached plan must not change result type"): the query is
    prepared again and answered, on every connection that had it."""

    async def main() -> None:
        conn = await _connect(fresh_db)
        other = await _connect(fresh_db)
        async with conn, other:
            await conn.execute("CREATE SCHEMA IF NOT EXISTS views")
            await conn.execute("CREATE TABLE views.swapped AS SELECT 1 AS k, 10 AS total")
            query = b"SELECT * FROM views.swapped WHERE k = CAST($1 AS integer)"
            for c in (conn, other):
                assert await pg_prepared.fetch(c, query, ["1"], ADAPTERS, tuple) == [(1, 10)]
            await conn.execute("CREATE TABLE views.swapped_v2 AS SELECT 1 AS k, 'ten'::text AS total, true AS extra")
            await conn.execute("DROP TABLE views.swapped")
            await conn.execute("ALTER TABLE views.swapped_v2 RENAME TO swapped")
            for c in (conn, other):
                assert await pg_prepared.fetch(c, query, ["1"], ADAPTERS, tuple) == [(1, "ten", True)]
                assert await pg_prepared.fetch(c, query, ["1"], ADAPTERS, tuple) == [(1, "ten", True)]

    uvloop.run(main())
