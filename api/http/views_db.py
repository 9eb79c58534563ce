"""The views' read side: a pool of connections tuned for view pages (`Views`), apart from the routes
that serve them (`routes_views`), so that the app's typed dependencies (`state`) can name its type."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, NamedTuple

from psycopg import AsyncConnection, errors, sql
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

__all__ = ["CONNECTION_WAIT_S", "PREPARE_THRESHOLD", "StatementTimeout", "ViewColumns", "Views"]

_MAX_SHAPES = 4096
PREPARE_THRESHOLD = 2  # runs of a query text on a connection before psycopg prepares it there
# How long a request waits for a pooled connection before its 503: the pool's default (30 s) would
# hold every request that long while the service database is down.
CONNECTION_WAIT_S = 5.0
# How long `Views` holds a connection taken from the pool, at most, before it gives it back: the
# pool's other users (and its checks) wait that long for it at worst.
HOLD_S = 0.1


class ViewColumns(NamedTuple):
    """What a page of one view needs, derived once per app from its projection."""

    types: dict[str, str]  # column -> declared SQL type, in table order
    primary_key: tuple[str, ...]


class _NumericText(Loader):
    """`numeric` as PostgreSQL's own text (`numeric_out`), which the JSON body carries as a string
    anyway: exact, spelled as the database spells it (no exponent), no `Decimal` per value."""

    def load(self, data: Buffer) -> str:
        return str(data, "ascii")


class StatementTimeout(Exception):
    """A view query ran past `[api] statement_timeout_ms` and PostgreSQL cancelled it."""


class Views:
    """The views' read side of one app: a pool of autocommit connections that return rows as dicts,
    numerics as text, prepare a query shape after `PREPARE_THRESHOLD` runs and keep at most
    `prepared_max` shapes prepared (each prepared plan holds backend memory), and whose statements
    PostgreSQL cancels after `statement_timeout_ms` (so slow filtered sorts cannot hold every pooled
    connection while point lookups wait), each taken from the pool and held for the next requests
    for at most `hold_s` (given back at once when a request waits for one there); and what is derived once from the
    projections (each view's columns, each request shape's SQL text)."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        *,
        max_size: int = 8,
        timeout: float = CONNECTION_WAIT_S,
        statement_timeout_ms: int = 0,
        prepared_max: int = 32,
        hold_s: float = HOLD_S,
    ) -> None:
        self.schema = schema
        self.hold_s = hold_s
        self.statement_timeout_ms = statement_timeout_ms
        self.prepared_max = prepared_max
        self.pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=max_size,
            timeout=timeout,
            open=False,
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                "prepare_threshold": PREPARE_THRESHOLD if prepared_max else None,
            },
            configure=self._configure,
        )
        self.meta: dict[str, ViewColumns] = {}
        self.sources: dict[str, Any] = {}  # the projection each view's `meta` was derived from
        # SQL text by request shape (view, filter columns and operators, order, cursor, limit):
        # composing and quoting it costs more than a point lookup's query; projections are fixed per app.
        self.queries: dict[tuple[Any, ...], str] = {}
        # Idle connections taken from the pool and held for the next requests (`_take`, `_keep`): a
        # pool checkout (its lock, its logging, its statistics) costs more than a point lookup's rows.
        self._held: list[AsyncConnection[Any]] = []
        self._sweep: asyncio.TimerHandle | None = None
        self._returning: set[asyncio.Future[None]] = set()  # the sweeps' tasks (the loop holds them only weakly)
        self._waiting = 0  # requests waiting for a connection from the pool (`_from_pool`)

    async def _configure(self, conn: AsyncConnection[Any]) -> None:
        conn.adapters.register_loader("numeric", _NumericText)
        conn.prepared_max = self.prepared_max or None
        if self.statement_timeout_ms:
            await conn.execute(
                sql.SQL("SET statement_timeout = {}").format(sql.Literal(self.statement_timeout_ms)), prepare=False
            )

    async def open(self) -> None:
        await self.pool.open(wait=False)

    async def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
        await asyncio.gather(*self._returning)
        await self._give_back_held()
        await self.pool.close()

    async def _take(self) -> AsyncConnection[Any]:
        """An idle connection this app holds (no lock, no pool bookkeeping: the event loop's thread is
        the only user), else one from the pool."""
        if self._held:
            return self._held.pop()
        return await self._from_pool()

    async def _from_pool(self) -> AsyncConnection[Any]:
        self._waiting += 1
        try:
            conn: AsyncConnection[Any] = await self.pool.getconn()
            return conn
        finally:
            self._waiting -= 1

    async def _keep(self, conn: AsyncConnection[Any]) -> None:
        """`conn` held for the next request, until the next sweep (at most `hold_s` from now) gives
        every held connection back to the pool (whose checks, lifetimes and other users then apply
        again); given back at once when a request waits for one there."""
        if self._waiting:
            await self.pool.putconn(conn)
            return
        self._held.append(conn)
        if self._sweep is None:
            self._sweep = asyncio.get_running_loop().call_later(self.hold_s, self._sweep_held)

    def _sweep_held(self) -> None:
        self._sweep = None
        task = asyncio.ensure_future(self._give_back_held())
        self._returning.add(task)
        task.add_done_callback(self._returning.discard)

    async def _give_back_held(self) -> None:
        held, self._held = self._held, []
        for conn in held:
            await self.pool.putconn(conn)

    async def fetch(self, shape: tuple[Any, ...], query: str | sql.Composable, args: Sequence[str | None]) -> list[Any]:
        """The rows of `query`, a request shape's SQL text (or its composition, rendered here once and
        kept under `shape`).

        A view swapped by a rebuild for a table of other column types makes PostgreSQL refuse a plan
        prepared before the swap (feature_not_supported, "cached plan must not change result
        type"), on every connection that prepared it: that connection is closed (the pool opens
        another) and the query runs once more, unprepared, on the next one. A lost connection
        raises `OperationalError` (the route's 503) after the pool has checked its idle ones (and
        those held here)."""
        try:
            conn = await self._take()
            try:
                if isinstance(query, str):
                    text = query
                else:  # rendered with the connection's quoting rules
                    if len(self.queries) >= _MAX_SHAPES:
                        self.queries.clear()
                    text = self.queries[shape] = query.as_string(conn)
                try:
                    rows: list[Any] = await (await conn.execute(text, args)).fetchall()
                except errors.FeatureNotSupported:
                    await conn.close()
                    await self.pool.putconn(conn)
                    other = await self._from_pool()
                    try:
                        return await (await other.execute(text, args, prepare=False)).fetchall()
                    finally:
                        await self.pool.putconn(other)
            except BaseException:
                # failed or cancelled mid-query: the pool checks it (a connection in a transaction or
                # broken is not lent again)
                if not conn.closed:
                    await self.pool.putconn(conn)
                raise
            await self._keep(conn)
            return rows
        except errors.QueryCanceled:  # statement_timeout (the connection is fine)
            raise StatementTimeout(
                f"the view query ran past [api] statement_timeout_ms = {self.statement_timeout_ms}"
            ) from None
        except errors.OperationalError:
            # Lost or refused (a restart, a failover, pg_terminate_backend): the other idle
            # connections are likely gone too. The pool checks them all now and replaces the dead
            # ones, so the next request gets a live connection rather than the next dead one.
            await self._give_back_held()
            await self.pool.check()
            raise
