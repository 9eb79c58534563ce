"""`api.pg_lease.Leases` over a real pool: idle connections come back last in first out without the
pool; a connection left in a query, a closed one and every `recycle_every`-th return go through the
pool (which discards what is not reusable); `close()` gives the kept ones back."""

from __future__ import annotations

import asyncio

import pytest
import uvloop
from psycopg_pool import AsyncConnectionPool

from api.pg_async import KeepReaderConnection
from api.pg_lease import Leases

pytestmark = pytest.mark.integration


def _pool(dsn: str) -> AsyncConnectionPool:
    return AsyncConnectionPool(
        dsn, min_size=1, max_size=4, open=False, kwargs={"autocommit": True}, connection_class=KeepReaderConnection
    )


def test_idle_connections_come_back_without_the_pool(fresh_db: str) -> None:
    async def main() -> None:
        async with _pool(fresh_db) as pool:
            leases = Leases(pool, keep=2, recycle_every=1000)
            a, b, c = await leases.get(), await leases.get(), await leases.get()
            assert pool.get_stats()["requests_num"] == 3
            for conn in (a, b, c):
                await leases.put(conn)  # two kept, the third back to the pool
            assert pool.get_stats()["pool_available"] >= 1
            assert await leases.get() is b and await leases.get() is a  # last in, first out
            assert pool.get_stats()["requests_num"] == 3  # the pool was not asked again
            await leases.put(a)
            await leases.put(b)
            await leases.close()
            assert pool.get_stats()["pool_available"] >= 3

    uvloop.run(main())


def test_busy_or_closed_connections_go_back_through_the_pool(fresh_db: str) -> None:
    async def main() -> None:
        async with _pool(fresh_db) as pool:
            leases = Leases(pool, keep=4, recycle_every=1000)
            conn = await leases.get()
            pid = conn.info.backend_pid
            query = asyncio.ensure_future(conn.execute("SELECT pg_sleep(30)"))
            await asyncio.sleep(0.2)
            query.cancel()
            with pytest.raises(asyncio.CancelledError):
                await query
            await leases.put(conn)  # still ACTIVE: the pool closes it
            assert conn.closed
            other = await leases.get()
            assert other.info.backend_pid != pid
            await other.close()
            await leases.put(other)
            fresh = await leases.get()
            assert not fresh.closed and fresh is not other
            assert await (await fresh.execute("SELECT 1")).fetchone() == (1,)
            await leases.put(fresh)
            await leases.close()

    uvloop.run(main())


def test_every_nth_return_goes_through_the_pool(fresh_db: str) -> None:
    async def main() -> None:
        async with _pool(fresh_db) as pool:
            leases = Leases(pool, keep=4, recycle_every=3)
            for _ in range(9):
                await leases.put(await leases.get())
            # the first get, then after the 3rd and the 6th return (the 9th went back and nothing asked since)
            assert pool.get_stats()["requests_num"] == 3

    uvloop.run(main())


def test_take_and_keep_without_coroutines(fresh_db: str) -> None:
    """`take` and `keep`, the views path's synchronous forms of `get` and `put`: the same LIFO and
    the same refusals (a busy connection is not kept: the caller hands it to the pool)."""

    async def main() -> None:
        async with _pool(fresh_db) as pool:
            leases = Leases(pool, keep=1, recycle_every=1000)
            assert leases.take() is None  # nothing kept yet
            a, b = await leases.get(), await leases.get()
            assert leases.keep(a) and not leases.keep(b)  # room for one
            await pool.putconn(b)
            assert leases.take() is a and leases.take() is None
            query = asyncio.ensure_future(a.execute("SELECT pg_sleep(30)"))
            await asyncio.sleep(0.2)
            query.cancel()
            with pytest.raises(asyncio.CancelledError):
                await query
            assert not leases.keep(a)  # still ACTIVE
            await pool.putconn(a)
            assert a.closed and leases.take() is None

    uvloop.run(main())
