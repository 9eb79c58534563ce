"""The HTTP API (FastAPI): commands, streams, views, admin, metrics and the console page.

`create_app(settings, dsn)` builds the app; `tributary serve` runs it under uvicorn. Routes live in
small modules by concern; this one wires them, the pool, the limits and the error mapping.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import psycopg
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from psycopg_pool import AsyncConnectionPool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Receive, Scope, Send

from tributary.api.http import (
    routes_admin,
    routes_commands,
    routes_groups,
    routes_lifecycle,
    routes_streams,
    routes_views,
)
from tributary.api.http.ahead import Ahead
from tributary.api.http.domains import document_domains
from tributary.api.http.front import Front, TemplateRoute
from tributary.api.http.limits import connections
from tributary.api.http.metrics import Metrics
from tributary.api.http.problems import Problem, carriable, code_for_status, handle_problem, problem_response
from tributary.api.http.scavenger import start_scavenger
from tributary.api.http.status import Serving, Status
from tributary.api.http.subscriptions import Subscriptions
from tributary.api.http.views_db import Views
from tributary.api.settings.config import Settings
from tributary.consumers import ConsumerError
from tributary.eventstore.handler import CommandHandler
from tributary.eventstore.loader import load_current
from tributary.eventstore.store import EventStore
from tributary.jsonvalue import JsonValue

__all__ = ["WORKER_CONFIG", "Service", "create_app", "worker_app"]

log = logging.getLogger(__name__)


class Service(FastAPI):
    """The FastAPI app behind `front` (`front.Front`: request id, request counts, head and body
    limits, the connection guard, HEAD), one pure-ASGI layer around FastAPI's middleware stack."""

    front: Front
    metrics: Metrics
    ahead = Ahead(())  # routes answered before FastAPI's middleware stack (`create_app`: a view page)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.front(scope, receive, send)

    async def serve_asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """What `front` wraps: FastAPI's own ASGI entry, or a route of `ahead` that takes the request."""
        route = self.ahead.match(scope)
        if route is None:
            await super().__call__(scope, receive, send)
        else:
            await self.ahead.serve(self, route, scope, receive, send)


def _allowed(request: Request) -> str:
    """Every method the OpenAPI document lists for the path (Starlette's 405 names only the first
    route that matched it, and one path may have a route per method: `GET` and `DELETE
    /streams/{id}`); empty when it lists none."""
    path = request.url.path
    paths = request.app.openapi().get("paths", {})
    for template, item in paths.items():
        if re.fullmatch(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)), path):
            return ", ".join(sorted(m.upper() for m in item if m != "parameters"))
    return ""


def create_app(settings: Settings, *, dsn: str) -> FastAPI:
    """An app bound to one service database; the pool opens on start-up and closes on shutdown.

    The aggregates of `[eventstore] modules` are loaded here, so a broken domain module stops the
    program before it serves (`AggregateDefinitionError`, one line naming the module); later changes
    to the modules are followed (`definitions.current_aggregates`)."""
    aggregates = load_current(settings.eventstore.modules)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=8,
            open=False,
            kwargs={"autocommit": True},
        )
        await pool.open(wait=False)
        views = Views(
            dsn,
            settings.projections.schema_,
            statement_timeout_ms=settings.api.statement_timeout_ms,
            prepared_max=settings.api.prepared_max,
        )
        await views.open()
        store = await asyncio.to_thread(EventStore.connect, dsn)
        handler = CommandHandler(
            store,
            aggregates,
            max_retries=settings.eventstore.max_retries,
            snapshot_every=settings.eventstore.snapshot_every or None,
        )
        metrics.known_stream_types(handler.aggregates)
        scavenging = start_scavenger(
            store, settings.eventstore.scavenge_interval_s, settings.eventstore.removed_positions_keep_s
        )
        subscriptions = Subscriptions(
            pool,
            poll_s=settings.api.subscription_poll_s,
            page=settings.api.subscription_page,
            keepalive_s=settings.api.subscription_keepalive_s,
            keys=store.keys,
        )
        subscriptions.end_on_exit_signals()
        consumers = routes_groups.start_consumers(settings, dsn=dsn)
        status = Status(settings.api.status_refresh_s, rebuilds=routes_admin.rebuilds)
        # What the routes use (`state`'s typed dependencies read these names), all put here.
        app.state.pool, app.state.views, app.state.handler, app.state.subscriptions = (
            pool,
            views,
            handler,
            subscriptions,
        )
        app.state.coordinator, app.state.log_changes = consumers.coordinator, consumers.changes
        app.state.status = status
        refreshing = status.start(
            Serving(
                state=app.state,
                pool=pool,
                settings=settings,
                metrics=metrics,
                dsn=dsn,
                coordinator=consumers.coordinator,
            )
        )
        try:
            yield
        finally:
            refreshing.cancel()
            if scavenging is not None:
                scavenging.cancel()
            await consumers.stop()
            await subscriptions.close()
            await asyncio.to_thread(store.close)
            await views.close()
            await pool.close()

    app = Service(
        title="tributary",
        version="0.1.0",
        description="Change-data capture, event sourcing and projections on PostgreSQL.",
        lifespan=lifespan,
        # No redirect of `/views/` to `/views`: Starlette builds its absolute URL from the Host header.
        redirect_slashes=False,
    )
    metrics = Metrics()
    # What is there before start-up (the rest: `lifespan`); `definitions` keeps its caches beside these.
    app.state.settings, app.state.dsn, app.state.metrics = settings, dsn, metrics
    app.state.aggregates = aggregates
    app.state.aggregates_by_module = {ref: load_current((ref,)) for ref in settings.eventstore.modules}
    app.metrics = metrics
    app.front = Front(
        app.serve_asgi,
        metrics=metrics,
        max_body_bytes=settings.api.max_body_bytes,
        max_header_bytes=settings.api.max_header_bytes,
    )
    connections.configure(
        timeout_s=settings.api.request_timeout_s,
        max_connections=settings.api.max_connections,
        max_header_bytes=settings.api.max_header_bytes,
        max_body_bytes=settings.api.max_body_bytes,
    )

    app.include_router(routes_commands.router)
    app.include_router(routes_streams.router)
    app.include_router(routes_lifecycle.router)
    app.include_router(routes_views.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_groups.router)
    app.router.routes[:0] = HOT_ROUTES  # a view page, a command: read and validated by their own routes
    app.ahead = Ahead([routes_views.VIEW_ROUTE], prefix="/views/")  # and a view page before the middleware
    app.add_exception_handler(ConsumerError, routes_groups.consumer_error)
    document_domains(app)

    app.add_exception_handler(Problem, handle_problem)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI's and Starlette's own: 404 of an unknown path, 405 (with its `Allow` header), …
        status, detail = exc.status_code, str(exc.detail)
        if status == 404 and detail == "Not Found":
            detail = f"no route {request.url.path}; /openapi.json lists the routes"
        elif status == 405 and exc.headers and "allow" in {k.lower() for k in exc.headers}:
            allowed = _allowed(request) or next(v for k, v in exc.headers.items() if k.lower() == "allow")
            detail = f"{request.method} is not allowed on {request.url.path} (allowed: {allowed})"
            headers = {k: v for k, v in exc.headers.items() if k.lower() != "allow"}
            return problem_response(status, code_for_status(status), detail, headers={**headers, "Allow": allowed})
        return problem_response(status, code_for_status(status), detail, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        # FastAPI's field errors as `errors`; their echo of the input JSON can carry a lone surrogate, NaN, Infinity.
        errors = jsonable_encoder(exc.errors())
        detail = _first_error(errors)
        try:
            return problem_response(422, "invalid_request", detail, errors=carriable(errors))
        except RecursionError:  # an input nested deeper than the walk may go: not echoed
            return problem_response(
                422, "invalid_request", detail, errors=carriable([_without_input(e) for e in errors])
            )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        # One line, no internals (DSNs, keys) in the body; the details go to the log.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(500, "internal_error", "internal error; see the server log")

    async def missing_schema(request: Request, exc: Exception) -> Response:
        # Served before `tributary init`: say so (503, one line) instead of a 500 and a trace.
        from tributary.eventstore.migrate import NotInitializedError, require_initialized

        try:
            await asyncio.to_thread(require_initialized, dsn)
        except NotInitializedError as missing:
            return problem_response(503, "not_initialized", str(missing))
        return await unexpected(request, exc)

    app.add_exception_handler(psycopg.errors.UndefinedTable, missing_schema)
    app.add_exception_handler(psycopg.errors.InvalidSchemaName, missing_schema)

    return app


# The routes most requests take, matched before the included routers (FastAPI keeps an included router
# as one entry of the route table: a request tries every route included before its own, then matches
# its router's routes a second time) and served without FastAPI's request handling: plain Starlette
# routes, undocumented, that answer as the documented routes do (those stay where they are: the
# OpenAPI document is unchanged, and the 405 of another method names what it lists: `_allowed`).
HOT_ROUTES: tuple[TemplateRoute, ...] = (routes_views.VIEW_ROUTE, routes_commands.COMMAND_ROUTE)


def _first_error(errors: Sequence[JsonValue]) -> str:
    """`detail` of a 422: the first field error in one line (`body.expected_version: Input should be …`)."""
    first = errors[0] if errors else None
    if not isinstance(first, dict):
        return "the request does not fit the route's schema"
    where = ".".join(str(part) for part in first.get("loc", ()))
    more = f" (and {len(errors) - 1} more in `errors`)" if len(errors) > 1 else ""
    message = carriable(str(first.get("msg", "invalid")).splitlines()[0] if first.get("msg") else "invalid")
    return f"{carriable(where)}: {message}{more}"


def _without_input(error: JsonValue) -> JsonValue:
    return {k: v for k, v in error.items() if k != "input"} if isinstance(error, dict) else error


WORKER_CONFIG = "_TRIBUTARY_SERVE_CONFIG"  # not TRIBUTARY_*: that prefix is for settings overrides


def worker_app() -> FastAPI:
    """The app of one `serve --workers N` worker process (uvicorn calls this factory in each):
    each worker rebuilds it from the config file `serve` validated (path in WORKER_CONFIG)."""
    from pathlib import Path

    from tributary.api.http.definitions import config_file
    from tributary.api.settings.config import load_settings
    from tributary.api.settings.logs import configure_json_logging
    from tributary.api.settings.service import service_dsn

    configure_json_logging()
    path = os.environ.get(WORKER_CONFIG, "")
    settings = load_settings(Path(path) if path else None)
    app = create_app(settings, dsn=service_dsn(settings))
    app.state.config_path = config_file(Path(path) if path else None)  # `[projections]` changes are followed
    return app
