"""`api.pg_pipeline.Pipelines` on a real PostgreSQL under uvloop: the same values as a cursor with
the same adapters, errors as a cursor raises them (each only its own request's), the answers of many
concurrent requests each to its own request, statements prepared once per connection (and not
beyond the cap), NUL refused before anything is sent, a cancelled query's connection kept, a lost
one replaced, a slow query not holding up the next, a swapped table prepared again."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
import uvloop
from psycopg.adapt import AdaptersMap
from psycopg.types.string import TextLoader

from tributary.api.http import pg_prepared
from tributary.api.http.pg_pipeline import Pipelines

pytestmark = pytest.mark.integration

ADAPTERS = AdaptersMap(psycopg.adapters)
ADAPTERS.register_loader("numeric", TextLoader)

TYPED = (
    "SELECT CAST($1 AS bigint) AS i, CAST($2 AS numeric(12,2)) AS n, CAST($3 AS text) AS t, "
    "CAST($4 AS double precision) AS f, CAST($5 AS boolean) AS b, CAST($6 AS timestamptz) AS ts, "
    "CAST($7 AS date) AS d, CAST($8 AS jsonb) AS j, CAST($9 AS integer) AS z"
)
PREPARED = b"SELECT count(*) FROM pg_prepared_statements"  # counts itself once it runs prepared
PID = b"SELECT pg_backend_pid()"


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
    cursor_query = (
        "SELECT "
        + ", ".join(
            f"CAST(%s AS {t})"
            for t in ("bigint", "numeric(12,2)", "text", "double precision", "boolean", "timestamptz", "date", "jsonb")
        )
        + ", CAST(%s AS integer)"
    )

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
            cur = conn.cursor()
            cur.adapters.register_loader("numeric", TextLoader)
            await cur.execute(cursor_query, [None if p is None else str(p) for p in params])
            expected = await cur.fetchall()
        async with Pipelines(fresh_db) as views:
            for _ in range(3):  # prepared on the first run, reused after
                got = await views.fetch(TYPED.encode(), params, ADAPTERS, tuple)
                assert got == expected
            assert got[0][1] == "0.00"  # numeric(12,2) as PostgreSQL spells it, not a Decimal
            assert await views.fetch(PREPARED, [], ADAPTERS, tuple) == [(2,)]

    uvloop.run(main())


def test_many_rows_and_make_row(fresh_db: str) -> None:
    async def main() -> None:
        async with Pipelines(fresh_db) as views:
            rows = await views.fetch(
                b"SELECT g, md5(g::text) FROM generate_series(1, CAST($1 AS integer)) g",
                ["50000"],
                ADAPTERS,
                lambda r: {"g": r[0], "h": r[1]},
            )
            assert len(rows) == 50000 and rows[-1]["g"] == 50000 and len(rows[-1]["h"]) == 32
            assert await views.fetch(b"SELECT 1 WHERE false", [], ADAPTERS, tuple) == []

    uvloop.run(main())


def test_concurrent_requests_each_get_their_own_answer_or_error(fresh_db: str) -> None:
    """Hundreds of queries in flight at once on one connection: each request gets its own rows,
    and a failing query fails only its own request."""

    async def main() -> None:
        async with Pipelines(fresh_db, size=1) as views:
            query = b"SELECT CAST($1 AS integer) * 2, CAST($2 AS text)"
            values = [str(i) if i % 7 else f"{i}x" for i in range(600)]  # every 7th is not an integer
            got = await asyncio.gather(
                *(views.fetch(query, [v, f"r{i}"], ADAPTERS, tuple) for i, v in enumerate(values)),
                return_exceptions=True,
            )
            for i, answer in enumerate(got):
                if i % 7:
                    assert answer == [(2 * i, f"r{i}")]
                else:
                    assert isinstance(answer, psycopg.errors.InvalidTextRepresentation), answer
            assert len({tuple(await views.fetch(PID, [], ADAPTERS, tuple)) for _ in range(3)}) == 1

    uvloop.run(main())


def test_errors_as_a_cursor_raises_them_and_the_connection_stays_usable(fresh_db: str) -> None:
    async def main() -> None:
        async with Pipelines(fresh_db) as views:
            with pytest.raises(psycopg.errors.InvalidTextRepresentation):
                await views.fetch(b"SELECT CAST($1 AS bigint)", ["1; DROP TABLE x"], ADAPTERS, tuple)
            with pytest.raises(psycopg.errors.UndefinedTable):
                await views.fetch(b"SELECT * FROM views.nothing_here", [], ADAPTERS, tuple)
            with pytest.raises(psycopg.errors.DataError):  # libpq would cut the text at the NUL
                await views.fetch(b"SELECT CAST($1 AS text)", ["1\x00 OR true"], ADAPTERS, tuple)
            assert await views.fetch(b"SELECT CAST($1 AS bigint)", ["7"], ADAPTERS, tuple) == [(7,)]
            # the failed prepare was not remembered: the table appears, the same text now runs
            async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                await conn.execute("CREATE SCHEMA IF NOT EXISTS views")
                await conn.execute("CREATE TABLE views.nothing_here AS SELECT 1 AS x")
            assert await views.fetch(b"SELECT * FROM views.nothing_here", [], ADAPTERS, tuple) == [(1,)]

    uvloop.run(main())


def test_requests_racing_a_failing_prepare_get_its_error(fresh_db: str) -> None:
    """Requests sent while the first one's Parse is still failing skip their own Parse; they get
    the real error (the missing table), not "prepared statement does not exist"."""

    async def main() -> None:
        async with Pipelines(fresh_db, size=1) as views:
            got = await asyncio.gather(
                *(views.fetch(b"SELECT * FROM views.not_yet", [], ADAPTERS, tuple) for _ in range(20)),
                return_exceptions=True,
            )
            assert all(isinstance(g, psycopg.errors.UndefinedTable) for g in got), got

    uvloop.run(main())


def test_prepares_up_to_the_cap_then_runs_unnamed(fresh_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_prepared, "MAX_PREPARED", 3)

    async def main() -> None:
        async with Pipelines(fresh_db) as views:
            for i in range(6):
                query = f"SELECT CAST($1 AS integer) + {i}".encode()
                for _ in range(2):
                    assert await views.fetch(query, ["1"], ADAPTERS, tuple) == [(1 + i,)]
            assert await views.fetch(PREPARED, [], ADAPTERS, tuple) == [(3,)]  # at the cap: unnamed

    uvloop.run(main())


def test_a_cancelled_query_keeps_its_connection_and_a_lost_one_is_replaced(fresh_db: str) -> None:
    async def main() -> None:
        async with Pipelines(fresh_db) as views:
            [(pid,)] = await views.fetch(PID, [], ADAPTERS, tuple)
            query = asyncio.ensure_future(views.fetch(b"SELECT pg_sleep(0.5)", [], ADAPTERS, tuple))
            await asyncio.sleep(0.1)
            query.cancel()
            with pytest.raises(asyncio.CancelledError):
                await query
            await asyncio.sleep(0.6)
            # its result was read and dropped when it came; the same connection answers the next one
            assert await views.fetch(b"SELECT 2", [], ADAPTERS, tuple) == [(2,)]
            assert await views.fetch(PID, [], ADAPTERS, tuple) == [(pid,)]

            query = asyncio.ensure_future(views.fetch(b"SELECT pg_sleep(30)", [], ADAPTERS, tuple))
            await asyncio.sleep(0.3)
            with psycopg.connect(fresh_db, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            with pytest.raises(psycopg.OperationalError):
                await asyncio.wait_for(query, 10)
            assert await views.fetch(b"SELECT 3", [], ADAPTERS, tuple) == [(3,)]
            [(new_pid,)] = await views.fetch(PID, [], ADAPTERS, tuple)
            assert new_pid != pid

    uvloop.run(main())


def test_a_slow_query_does_not_hold_up_the_next(fresh_db: str) -> None:
    """A query in flight for longer than `STALL_S` sends the next requests to another connection."""

    async def main() -> None:
        async with Pipelines(fresh_db, size=2) as views:
            await views.fetch(b"SELECT 1", [], ADAPTERS, tuple)
            slow = asyncio.ensure_future(views.fetch(b"SELECT 1 FROM pg_sleep(3)", [], ADAPTERS, tuple))
            await asyncio.sleep(Pipelines.STALL_S * 4)
            fast = asyncio.ensure_future(views.fetch(b"SELECT 2", [], ADAPTERS, tuple))
            done, _ = await asyncio.wait({slow, fast}, return_when=asyncio.FIRST_COMPLETED)
            assert done == {fast} and fast.result() == [(2,)]
            assert await slow == [(1,)]

    uvloop.run(main())


def test_a_view_swapped_for_one_of_other_column_types_is_prepared_again(fresh_db: str) -> None:
    """A projection's rebuild swaps its table for one whose columns may differ; PostgreSQL then
    refuses the prepared statement ("cached plan must not change result type"): the query is
    prepared again and answered, on every connection that had it, concurrent requests included."""

    async def main() -> None:
        async with Pipelines(fresh_db, size=2) as views:
            async with await psycopg.AsyncConnection.connect(fresh_db, autocommit=True) as conn:
                await conn.execute("CREATE SCHEMA IF NOT EXISTS views")
                await conn.execute("CREATE TABLE views.swapped AS SELECT 1 AS k, 10 AS total")
                query = b"SELECT * FROM views.swapped WHERE k = CAST($1 AS integer)"
                assert await views.fetch(query, ["1"], ADAPTERS, tuple) == [(1, 10)]
                await conn.execute(
                    "CREATE TABLE views.swapped_v2 AS SELECT 1 AS k, 'ten'::text AS total, true AS extra"
                )
                await conn.execute("DROP TABLE views.swapped")
                await conn.execute("ALTER TABLE views.swapped_v2 RENAME TO swapped")
            got = await asyncio.gather(*(views.fetch(query, ["1"], ADAPTERS, tuple) for _ in range(10)))
            assert got == [[(1, "ten", True)]] * 10
            assert await views.fetch(query, ["1"], ADAPTERS, tuple) == [(1, "ten", True)]

    uvloop.run(main())
