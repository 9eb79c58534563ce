"""Pooled connections lent to view queries without a trip through the pool on every request.

`AsyncConnectionPool.getconn` + `putconn` take the pool's lock twice, update its statistics, log and
check the returned connection: ≈ 6 % of a point lookup's server CPU. A few idle connections are
kept here instead, last in first out (one worker serves few concurrent queries). Anything not
plainly idle (a failed, lost or cancelled query) goes back through the pool, which resets or
discards it, and so does every `recycle_every`-th return, so the pool's lifetime rules still apply;
`close()` hands the kept ones back before the pool closes.
"""

from __future__ import annotations

from typing import Any

from psycopg import pq
from psycopg_pool import AsyncConnectionPool

__all__ = ["Leases"]

_IDLE = pq.TransactionStatus.IDLE


class Leases:
    def __init__(self, pool: AsyncConnectionPool[Any], *, keep: int = 4, recycle_every: int = 1000) -> None:
        self.pool = pool
        self._idle: list[Any] = []
        self._keep = keep
        self._every = recycle_every
        self._returns = 0

    def take(self) -> Any:
        """The connection most recently returned, or `None` (then `get` one): no coroutine to run."""
        return self._idle.pop() if self._idle else None

    async def get(self) -> Any:
        """A connection: the one most recently returned, else a new lease from the pool."""
        if self._idle:
            return self._idle.pop()
        return await self.pool.getconn()

    def keep(self, conn: Any) -> bool:
        """Keep a returned connection for the next `get` if it is plainly idle; `False`: it must go
        back to the pool (`pool.putconn`, or `put` instead of this)."""
        self._returns += 1
        if (
            len(self._idle) < self._keep
            and self._returns % self._every
            and conn.pgconn.transaction_status == _IDLE
            and not conn.closed
        ):
            self._idle.append(conn)
            return True
        return False

    async def put(self, conn: Any) -> None:
        if not self.keep(conn):
            await self.pool.putconn(conn)

    async def close(self) -> None:
        """Give the kept connections back to the pool (before it closes)."""
        idle, self._idle = self._idle, []
        for conn in idle:
            await self.pool.putconn(conn)
