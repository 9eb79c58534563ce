"""The HTTP API (FastAPI): commands, streams, views, admin, metrics and the console page.

`create_app(settings, dsn)` builds the app; `tributary serve` runs it under uvicorn. Routes live in
small modules by concern; this one wires them, the pool, the limits and the error mapping.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool
from starlette.types import Message, Receive, Scope, Send

from tributary.api.http import routes_admin, routes_commands, routes_views
from tributary.api.http.limits import BodyLimit
from tributary.api.http.metrics import Metrics
from tributary.api.http.pg_async import KeepReaderConnection
from tributary.api.http.pg_pipeline import Pipelines
from tributary.api.settings.config import Settings
from tributary.api.settings.logs import REQUEST_ID
from tributary.eventstore.domain.bank import bank_account
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.store import EventStore

__all__ = ["WORKER_CONFIG", "Service", "create_app", "worker_app"]

log = logging.getLogger(__name__)

_INTERNAL_ERROR = b'{"detail":"internal error; see the server log"}'
_CLIENT_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}")
_VIEW_ROUTE = "/views/{name}"
_VIEW_TRIED = "tributary.view_tried"  # scope keys (ASGI allows extensions; namespaced)
_REQUEST_ID_KEY = "tributary.request_id"


def _new_id_prefix() -> None:
    global _id_prefix, _id_seq
    _id_prefix, _id_seq = secrets.token_hex(5) + "-", itertools.count(1)


_id_prefix, _id_seq = "", itertools.count(1)
_new_id_prefix()
os.register_at_fork(after_in_child=_new_id_prefix)  # forked workers must not repeat the parent's ids


class Service(FastAPI):
    """The FastAPI app, plus what every HTTP request gets before FastAPI's middleware stack:

    - a request id (the client's `X-Request-ID` when it is a short token, else a new
      `<process prefix>-<counter>`), sent back as `X-Request-ID` and in every log record written while
      serving the request (`api.logs.REQUEST_ID`);
    - a count in `tributary_http_requests_total` by method, route template and status;
    - the plain successful `GET /views/{name}` served by `routes_views.fast_page` without FastAPI's
      routing, dependencies and middleware (anything else it hands to the app).

    Plain ASGI on purpose: a Starlette `BaseHTTPMiddleware` costs a task and a stream per request.
    What it uses on every request are attributes of its own (`metrics`, the views' runtime): each
    `app.state.x` is a failed attribute lookup and a `__getattr__` call."""

    metrics: Metrics
    _views: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        if _VIEW_TRIED not in scope and (got := await self.view_response(scope)) is not None:
            status, headers, body = got
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        request_id = _request_id(scope)
        token = REQUEST_ID.set(request_id.decode())
        id_header = (b"x-request-id", request_id)
        status = 500  # until the app's response starts

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), id_header]
            await send(message)

        try:
            await super().__call__(scope, receive, send_with_id)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.count_request(scope["method"], route, status)
            REQUEST_ID.reset(token)

    async def view_response(self, scope: Scope) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
        """Status, headers and body of a plain successful `GET /views/{name}` (or its 500), counted
        and logged under its request id; `None` (the scope marked as tried) hands it to the app.

        `api.http_protocol` calls this for such requests before uvicorn's ASGI machinery, and
        `__call__` for the rest of the world (any other ASGI server, test clients)."""
        if (
            scope["method"] != "GET"
            or not scope["path"].startswith("/views/")
            or scope.get("root_path")
            or _has_body(scope)
        ):
            scope[_VIEW_TRIED] = True
            return None
        scope["app"] = self  # as Starlette sets it: `Request(scope).app` for the fast path's auth check
        request_id = _request_id(scope)
        token = REQUEST_ID.set(request_id.decode())
        try:
            try:
                views = self._views or routes_views.runtime(self.state)
                if views is None:  # not started yet: the route says so
                    scope[_VIEW_TRIED] = True
                    return None
                self._views = views
                body = await routes_views.fast_page(self.state, views, scope)
            except Exception:  # the route would have reached `unexpected` below: the same 500
                log.exception("unhandled error on GET %s", scope["path"])
                body, status = _INTERNAL_ERROR, 500
            else:
                if body is None:
                    scope[_VIEW_TRIED] = True
                    return None
                status = 200
            self.metrics.count_request("GET", _VIEW_ROUTE, status)
        finally:
            REQUEST_ID.reset(token)
        return (
            status,
            [
                (b"content-length", b"%d" % len(body)),
                (b"content-type", b"application/json"),
                (b"x-request-id", request_id),
            ],
            body,
        )


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:  # ASGI header names are lower-case
        if name == b"content-length":
            if value != b"0":
                return True
        elif name == b"transfer-encoding":
            return True
    return False


def _request_id(scope: Scope) -> bytes:
    """The client's `X-Request-ID` when it is a short token, else a new one; kept in the scope, so a
    request handed from the fast path to the app keeps its id."""
    request_id: bytes | None = scope.get(_REQUEST_ID_KEY)
    if request_id is None:
        request_id = b""
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                request_id = value
        if not (request_id and _CLIENT_REQUEST_ID.fullmatch(request_id)):
            request_id = f"{_id_prefix}{next(_id_seq):x}".encode()
        scope[_REQUEST_ID_KEY] = request_id
    return request_id


def create_app(settings: Settings, *, dsn: str) -> FastAPI:
    """An app bound to one service database; the pool opens on start-up and closes on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=8,
            open=False,
            kwargs={"autocommit": True},
            connection_class=KeepReaderConnection,
        )
        await pool.open(wait=False)
        app.state.pool = pool
        app.state.view_connections = views = Pipelines(dsn)
        app.state.views_runtime = app._views = None  # type: ignore[attr-defined] # built anew on this pool
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
            await views.close()
            await pool.close()

    app = Service(
        title="tributary",
        version="0.1.0",
        description="Change-data capture, event sourcing and projections on PostgreSQL.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.dsn = dsn
    app.state.metrics = app.metrics = Metrics()
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


WORKER_CONFIG = "_TRIBUTARY_SERVE_CONFIG"  # not TRIBUTARY_*: that prefix is for settings overrides


def worker_app() -> FastAPI:
    """The app of one `serve --workers N` worker process (uvicorn calls this factory in each):
    each worker rebuilds it from the config file `serve` validated (path in WORKER_CONFIG)."""
    from pathlib import Path

    from tributary.api.settings.config import load_settings
    from tributary.api.settings.logs import configure_json_logging
    from tributary.api.settings.service import service_dsn

    configure_json_logging()
    path = os.environ.get(WORKER_CONFIG, "")
    settings = load_settings(Path(path) if path else None)
    return create_app(settings, dsn=service_dsn(settings))
