"""The routes most requests take (a view page, a command) are matched at the head of the app's route
table, ahead of the included routers, by plain Starlette routes without an entry in the OpenAPI
document; they keep their scopes (the view page and the command check the key themselves)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.routing import Match, Route

from tributary.api.http import routes_commands, routes_views
from tributary.api.http.app import HOT_ROUTES, create_app
from tributary.api.settings.config import ApiKey, ApiSettings, EventStoreSettings, Settings

pytestmark = pytest.mark.unit

DSN = "postgresql://unused.invalid/none"  # never started: no request here reaches the database


def _app(keys: tuple[ApiKey, ...] = ()) -> FastAPI:
    """An app never started: its lifespan (pools, database) does not run, its routes see it starting."""
    settings = Settings(api=ApiSettings(keys=keys), eventstore=EventStoreSettings(modules=("tests.domains.tally",)))
    return create_app(settings, dsn=DSN)


def _request(app: FastAPI, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(go())


def _first_match(app: FastAPI, method: str, path: str) -> Route:
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}
    for route in app.routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            assert isinstance(route, Route)
            return route
    raise AssertionError(f"nothing matches {method} {path}")


@pytest.mark.parametrize(
    ("method", "path", "endpoint"),
    [
        ("GET", "/views/accounts", routes_views.VIEW_ROUTE.endpoint),
        ("POST", "/commands/tally/t-1", routes_commands.COMMAND_ROUTE.endpoint),
    ],
)
def test_a_hot_route_is_matched_before_the_included_routers(method: str, path: str, endpoint: object) -> None:
    app = _app()
    route = _first_match(app, method, path)
    assert route.endpoint is endpoint
    assert app.routes.index(route) < len(HOT_ROUTES)
    assert not route.include_in_schema
    # the documented route, in its router, is still the one in the OpenAPI document
    assert method.lower() in app.openapi()["paths"][route.path]


def test_the_view_page_keeps_its_read_scope() -> None:
    app = _app((ApiKey(key="reader", scopes=("read",)), ApiKey(key="writer", scopes=("write",))))
    assert _request(app, "GET", "/views/accounts").status_code == 401
    assert _request(app, "GET", "/views/accounts", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert _request(app, "GET", "/views/accounts", headers={"X-API-Key": "writer"}).status_code == 403
    # the key passes; the views' pool is not open (no lifespan): "starting up"
    assert _request(app, "GET", "/views/accounts", headers={"X-API-Key": "reader"}).status_code == 503
    refused = _request(app, "GET", "/views/accounts", headers={"Authorization": "Bearer writer"})
    assert refused.json()["code"] == "forbidden"


def test_a_command_keeps_its_write_scope() -> None:
    app = _app((ApiKey(key="reader", scopes=("read",)),))
    sent = _request(app, "POST", "/commands/tally/t-1", json={"type": "add"}, headers={"X-API-Key": "reader"})
    assert sent.status_code == 403
    # the key is checked before the body: no field errors for a client without a key
    assert _request(app, "POST", "/commands/tally/t-1", json={"nope": 1}).status_code == 401


def test_other_methods_on_a_hot_path_still_get_405_with_allow() -> None:
    refused = _request(_app(), "POST", "/views/accounts")
    assert refused.status_code == 405
    assert refused.headers["allow"] == "GET"


def test_a_hot_routes_requests_are_counted_by_its_path_template() -> None:
    app = _app()
    _request(app, "GET", "/views/accounts")  # 503: starting up
    _request(app, "POST", "/commands/tally/t-1", json={"type": "add"})
    _request(app, "PUT", "/views/accounts")  # 405
    counted = {(method, route) for method, route, _ in app.metrics.http_requests.counts}
    assert {
        ("GET", "/views/{name}"),
        ("POST", "/commands/{stream_type}/{stream_id}"),
        ("PUT", "/views/{name}"),
    } <= counted
    assert not any(route == "unmatched" for _, route in counted), counted
