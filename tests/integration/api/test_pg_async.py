"""`KeepReaderConnection` on a real PostgreSQL, under uvloop (what `tributary serve` runs) and the
stock asyncio loop: results as psycopg's, no busy loop when an idle connection's server goes away,
and no registration left behind when a query fails, is cancelled or the connection closes (a
descriptor number reused by the next connection must keep working)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg
import pytest
import uvloop
from psycopg_pool import AsyncConnectionPool

from tributary.api.http.pg_async import KeepReaderConnection

pytestmark = pytest.mark.integration

Runner = Callable[[Coroutine[Any, Any, None]], None]
RUNNERS = {"uvloop": uvloop.run, "asyncio": asyncio.run}


@pytest.fixture(params=list(RUNNERS))
def run(request: pytest.FixtureRequest) -> Runner:
    return RUNNERS[request.param]


async def _connect(dsn: str) -> KeepReaderConnection:
    return await KeepReaderConnection.connect(dsn, autocommit=True)


def _terminate(dsn: str, pid: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def _works(dsn: str) -> None:
    conn = await _connect(dsn)
    try:
        for i in range(20):
            cur = await conn.execute("SELECT %s::int + 1", (i,))
            assert await cur.fetchone() == (i + 1,)
    finally:
        await conn.close()


def test_results_as_psycopg_small_large_and_a_write_wait(fresh_db: str, run: Runner) -> None:
    big = "x" * (32 << 20)  # a parameter larger than the socket buffer: the send waits for writability

    async def main() -> None:
        conn = await _connect(fresh_db)
        async with conn:
            cur = conn.cursor()
            for i in range(300):  # small results; prepared after the fifth run
                await cur.execute("SELECT %s::bigint, 'v' || %s::text", (i, i))
                assert await cur.fetchall() == [(i, f"v{i}")]
            await cur.execute("SELECT g, md5(g::text) FROM generate_series(1, 200000) g")  # many reads
            rows = await cur.fetchall()
            assert len(rows) == 200000 and rows[-1][0] == 200000
            await cur.execute("SELECT length(%s::text)", (big,))
            assert await cur.fetchone() == (len(big),)
            await cur.execute("SELECT 1")
            assert await cur.fetchone() == (1,)

    run(main())


def test_idle_connection_closed_by_the_server_does_not_spin(fresh_db: str, run: Runner) -> None:
    async def main() -> None:
        conn = await _connect(fresh_db)
        await (await conn.execute("SELECT 1")).fetchall()
        _terminate(fresh_db, conn.info.backend_pid)
        cpu = time.process_time()
        await asyncio.sleep(0.6)  # a reader left registered on the closed socket would fire all along
        assert time.process_time() - cpu < 0.3
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(conn.execute("SELECT 1"), 10)
        await _works(fresh_db)  # may reuse the descriptor number
        await conn.close()
        await _works(fresh_db)

    run(main())


def test_backend_lost_during_a_query(fresh_db: str, run: Runner) -> None:
    async def main() -> None:
        conn = await _connect(fresh_db)
        other = await _connect(fresh_db)  # registered on its own descriptor throughout
        await (await other.execute("SELECT 1")).fetchall()
        query = asyncio.ensure_future(conn.execute("SELECT pg_sleep(30)"))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(_terminate, fresh_db, conn.info.backend_pid)
        with pytest.raises(psycopg.OperationalError):
            await asyncio.wait_for(query, 10)
        await _works(fresh_db)
        await conn.close()
        assert await (await other.execute("SELECT 2")).fetchone() == (2,)
        await other.close()

    run(main())


def test_cancelled_wait_leaves_nothing_registered(fresh_db: str, run: Runner) -> None:
    async def main() -> None:
        conn = await _connect(fresh_db)
        query = asyncio.ensure_future(conn.execute("SELECT pg_sleep(30)"))
        await asyncio.sleep(0.3)
        query.cancel()
        with pytest.raises(asyncio.CancelledError):
            await query
        await conn.close()
        await _works(fresh_db)

    run(main())


def test_pool_of_them_under_concurrency(fresh_db: str, run: Runner) -> None:
    async def main() -> None:
        async with AsyncConnectionPool(
            fresh_db, min_size=2, max_size=4, kwargs={"autocommit": True}, connection_class=KeepReaderConnection
        ) as pool:

            async def client(k: int) -> None:
                for i in range(100):
                    async with pool.connection() as conn:
                        cur = await conn.execute("SELECT %s::int * 1000 + %s::int", (k, i))
                        assert await cur.fetchone() == (k * 1000 + i,)

            await asyncio.gather(*(client(k) for k in range(8)))

    run(main())


def test_quiet_intervals_during_a_long_query(fresh_db: str, run: Runner) -> None:
    """A query quiet for several `interval`s (the per-connection watchdog ends each wait in turn)
    returns its result; a second connection's queries meanwhile are unaffected."""

    async def main() -> None:
        conn = await _connect(fresh_db)
        other = await _connect(fresh_db)
        slow = asyncio.ensure_future(conn.execute("SELECT 7 FROM pg_sleep(0.45)"))
        started = time.monotonic()
        for i in range(30):
            assert await (await other.execute("SELECT %s::int", (i,))).fetchone() == (i,)
        assert await (await slow).fetchone() == (7,)
        assert time.monotonic() - started >= 0.45
        await conn.close()
        await other.close()

    run(main())
