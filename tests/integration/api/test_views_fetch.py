"""`routes_views.Views`, the views' read side, on a real PostgreSQL under uvloop (what `tributary
serve` runs): values as PostgreSQL spells them, text parameters cast by the query, a query text
prepared on a connection after `PREPARE_THRESHOLD` runs, NUL refused, a cancelled query's
connection kept, lost connections replaced after one failure, an unreachable database reported
within `CONNECTION_WAIT_S`, a swapped view of other column types answered, a connection held
between requests rather than checked out of the pool for each."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

import psycopg
import pytest
import uvloop

from tributary.api.http.routes_views import CONNECTION_WAIT_S, PREPARE_THRESHOLD, Views
from tributary.api.http.views_db import HOLD_S

pytestmark = pytest.mark.integration

PID = "SELECT pg_backend_pid() AS pid"
# (spelled so that it does not count itself)
PREPARED = "SELECT count(*) AS n FROM pg_prepared_statements WHERE statement LIKE '%%' || 'views' || '.counted%%'"


def _run(dsn: str, test: Any, *, max_size: int = 4, hold_s: float = HOLD_S) -> None:
    async def main() -> None:
        views = Views(dsn, "views", max_size=max_size, hold_s=hold_s)
        await views.open()
        try:
            await test(views)
        finally:
            await views.close()

    uvloop.run(main())


def test_values_as_postgresql_spells_them_parameters_cast_from_text(fresh_db: str) -> None:
    query = (
        "SELECT CAST(%s AS bigint) AS i, CAST(%s AS numeric(12,2)) AS n, CAST(%s AS text) AS t, "
        "CAST(%s AS double precision) AS f, CAST(%s AS boolean) AS b, CAST(%s AS timestamptz) AS ts, "
        "CAST(%s AS date) AS d, CAST(%s AS jsonb) AS j, CAST(%s AS integer) AS z, "
        "CAST(%s AS numeric) AS big, CAST(%s AS numeric) AS nan"
    )
    args = [
        "9007199254740993",
        "0.0000001",
        'quote " back \\ slash, é, ☃',
        "1.5e-07",
        "true",
        "2024-02-29 12:34:56.789+02",
        "2024-02-29",
        '{"a": [1, 2.5, null]}',
        None,
        "150000000000000000000",
        "NaN",
    ]

    async def test(views: Views) -> None:
        (row,) = await views.fetch(("typed",), query, args)
        assert row == {
            "i": 9007199254740993,
            "n": "0.00",  # numeric(12,2) rounds; as text, spelled as PostgreSQL spells it
            "t": 'quote " back \\ slash, é, ☃',
            "f": 1.5e-07,
            "b": True,
            "ts": dt.datetime(2024, 2, 29, 10, 34, 56, 789000, tzinfo=dt.UTC),
            "d": dt.date(2024, 2, 29),
            "j": {"a": [1, 2.5, None]},
            "z": None,
            "big": "150000000000000000000",  # not 1.5E+20
            "nan": "NaN",
        }

    _run(fresh_db, test)


def test_a_query_text_is_prepared_after_the_threshold_runs(fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA views")
        conn.execute("CREATE TABLE views.counted AS SELECT 1 AS k")
    counted = "SELECT k FROM views.counted WHERE k = CAST(%s AS integer)"

    async def test(views: Views) -> None:  # one connection: every query runs on it
        for _ in range(PREPARE_THRESHOLD):
            assert await views.fetch(("c",), counted, ["1"]) == [{"k": 1}]
        assert await views.fetch(("p",), PREPARED, []) == [{"n": 0}]
        assert await views.fetch(("c",), counted, ["1"]) == [{"k": 1}]
        assert await views.fetch(("p",), PREPARED, []) == [{"n": 1}]

    _run(fresh_db, test, max_size=1)


def test_nul_in_a_value_is_a_data_error(fresh_db: str) -> None:
    async def test(views: Views) -> None:
        with pytest.raises(psycopg.DataError):
            await views.fetch(("nul",), "SELECT CAST(%s AS text) AS t", ["a\x00b"])
        assert await views.fetch(("one",), "SELECT 1 AS one", []) == [{"one": 1}]

    _run(fresh_db, test, max_size=1)


def test_a_cancelled_query_leaves_its_connection_usable(fresh_db: str) -> None:
    async def test(views: Views) -> None:
        ((pid,),) = [tuple(r.values()) for r in await views.fetch(("pid",), PID, [])]
        query = asyncio.ensure_future(views.fetch(("sleep",), "SELECT pg_sleep(5)", []))
        await asyncio.sleep(0.3)
        query.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(query, 10)
        assert await views.fetch(("two",), "SELECT 2 AS two", []) == [{"two": 2}]
        assert await views.fetch(("pid",), PID, []) == [{"pid": pid}]  # the same connection, not replaced

    _run(fresh_db, test, max_size=1)


def test_lost_connections_fail_one_request_then_are_replaced(fresh_db: str) -> None:
    """Every backend killed while the pool holds several idle connections: one request fails with
    `OperationalError` (the route's 503), the next gets a live connection."""

    async def test(views: Views) -> None:
        await views.pool.resize(3, 3)
        await views.pool.wait(timeout=30)
        pids = {
            r[0]["pid"]
            for r in await asyncio.gather(*(views.fetch(("pid",), f"{PID}, pg_sleep(0.2)", []) for _ in range(3)))
        }
        assert len(pids) == 3
        with psycopg.connect(fresh_db, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (list(pids),))
        with pytest.raises(psycopg.OperationalError):
            await views.fetch(("pid",), PID, [])
        ((pid,),) = [tuple(r.values()) for r in await views.fetch(("pid",), PID, [])]
        assert pid not in pids

    _run(fresh_db, test)


def test_a_view_swapped_for_one_of_other_column_types_is_answered(fresh_db: str) -> None:
    """A projection's rebuild swaps its table for one whose columns may differ; PostgreSQL then
    refuses the prepared statement ("cached plan must not change result type"): the query is
    answered anyway, on every connection that had prepared it, concurrent requests included."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA views")
        conn.execute("CREATE TABLE views.swapped AS SELECT 1 AS k, 10 AS total")
    query = "SELECT * FROM views.swapped WHERE k = CAST(%s AS integer)"

    async def test(views: Views) -> None:
        await views.pool.resize(2, 2)
        await views.pool.wait(timeout=30)
        for _ in range(3):  # prepared on both connections
            got = await asyncio.gather(
                *(views.fetch(("q",), f"{query} AND pg_sleep(0.05) IS NOT NULL", ["1"]) for _ in range(2))
            )
            assert got == [[{"k": 1, "total": 10}]] * 2
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("CREATE TABLE views.swapped_v2 AS SELECT 1 AS k, 'ten'::text AS total, true AS extra")
            with conn.transaction():
                conn.execute("DROP TABLE views.swapped")
                conn.execute("ALTER TABLE views.swapped_v2 RENAME TO swapped")
        slow = f"{query} AND pg_sleep(0.05) IS NOT NULL"
        got = await asyncio.gather(*(views.fetch(("q",), slow, ["1"]) for _ in range(6)))
        assert got == [[{"k": 1, "total": "ten", "extra": True}]] * 6
        assert await views.fetch(("q",), slow, ["1"]) == [{"k": 1, "total": "ten", "extra": True}]

    _run(fresh_db, test)


def test_an_unreachable_database_fails_a_request_within_the_wait() -> None:
    """Nothing listens at the DSN's port: a request fails with `OperationalError` (the route's 503)
    after `CONNECTION_WAIT_S`, not after the pool's default half minute."""
    from tributary.api.devdb.embedded import free_port

    dsn = f"postgresql://nobody@127.0.0.1:{free_port()}/none?connect_timeout=2"

    async def main() -> float:
        views = Views(dsn, "views")
        await views.open()
        try:
            start = time.monotonic()
            with pytest.raises(psycopg.OperationalError):
                await views.fetch(("one",), "SELECT 1 AS one", [])
            return time.monotonic() - start
        finally:
            await views.close()

    assert uvloop.run(main()) < CONNECTION_WAIT_S + 3


def test_a_connection_is_held_between_requests_then_given_back(fresh_db: str) -> None:
    """Requests one after another take no connection from the pool but the first (a checkout costs
    more CPU than a point lookup's rows); within `hold_s` the connection goes back to the pool by
    itself, for its other users (here one that waits for the pool's only connection)."""

    async def held(views: Views) -> None:
        await views.pool.wait(timeout=30)
        ((pid,),) = [tuple(r.values()) for r in await views.fetch(("pid",), PID, [])]
        checkouts = views.pool.get_stats()["requests_num"]
        for _ in range(20):
            assert await views.fetch(("pid",), PID, []) == [{"pid": pid}]
        assert views.pool.get_stats()["requests_num"] == checkouts

    async def given_back(views: Views) -> None:
        await views.fetch(("pid",), PID, [])
        async with views.pool.connection(timeout=CONNECTION_WAIT_S) as conn:
            await conn.execute("SELECT 1")
        assert await views.fetch(("pid",), PID, [])

    _run(fresh_db, held, max_size=1, hold_s=600)
    _run(fresh_db, given_back, max_size=1)
