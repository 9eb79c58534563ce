"""The HTTP API (FastAPI): commands, streams, views, admin, metrics and the console page.

`create_app(settings, dsn)` builds the app; `tributary serve` runs it under uvicorn. Routes live in
small modules by concern; this one wires them, the pool, the limits and the error mapping.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool

from api import routes_admin, routes_commands, routes_views
from api.config import Settings
from api.limits import BodyLimit
from api.metrics import Metrics
from eventstore.domain.bank import bank_account
from eventstore.handler import CommandHandler
from eventstore.store import EventStore

__all__ = ["create_app"]

log = logging.getLogger(__name__)


def create_app(settings: Settings, *, dsn: str) -> FastAPI:
    """An app bound to one service database; the pool opens on start-up and closes on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = AsyncConnectionPool(dsn, min_size=1, max_size=8, open=False, kwargs={"autocommit": True})
        await pool.open(wait=False)
        app.state.pool = pool
        store = await asyncio.to_thread(EventStore.connect, dsn)
        app.state.handler = CommandHandler(
            store,
            {"account": bank_account(overdraft_fee=Decimal(settings.eventstore.overdraft_fee))},
            max_retries=settings.eventstore.max_retries,
            snapshot_every=settings.eventstore.snapshot_every or None,
        )
        try:
            yield
        finally:
            await asyncio.to_thread(store.close)
            await pool.close()

    app = FastAPI(
        title="tributary",
        version="0.1.0",
        description="Change-data capture, event sourcing and projections on PostgreSQL.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.dsn = dsn
    app.state.metrics = Metrics()
    app.add_middleware(routes_views.ViewsFastPath)  # inside BodyLimit: added first, runs second
    app.add_middleware(BodyLimit, max_bytes=settings.api.max_body_bytes)

    app.include_router(routes_commands.router)
    app.include_router(routes_views.router)
    app.include_router(routes_admin.router)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # One line, no internals (DSNs, keys) in the body; the details go to the log.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": "internal error; see the server log"}, status_code=500)

    return app


def pool_of(request: Request) -> Any:
    return request.app.state.pool
