"""A route answered ahead of FastAPI's middleware stack (`ahead.Ahead`) answers and fails as the same
route does behind it: each error goes to the app's handler of it, an unexpected one to the app's 500
handler and then on to the server; requests it does not take go through the stack."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tributary.api.http.ahead import Ahead

pytestmark = pytest.mark.unit


class Handled(Exception):
    """An error the app has a handler for."""


class HandledChild(Handled):
    """Handled by its parent's handler (found by the MRO)."""


async def _endpoint(request: Request) -> Response:
    what = request.path_params["what"]
    errors: dict[str, Exception] = {
        "handled": Handled("one"),
        "child": HandledChild("two"),
        "http404": HTTPException(404, "gone"),
        "http418": HTTPException(418, "teapot"),
        "unexpected": RuntimeError("boom"),
    }
    if what in errors:
        raise errors[what]
    return PlainTextResponse(f"fine {what}")


ROUTE = Route("/hot/{what}", _endpoint, methods=["GET"])


async def _handled(request: Request, exc: Exception) -> Response:
    return JSONResponse({"handled": str(exc)}, status_code=409)


async def _http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"http": exc.detail}, status_code=exc.status_code)


def _teapot(request: Request, exc: Exception) -> Response:  # a plain function: run in the thread pool
    return PlainTextResponse("by status", status_code=418)


async def _unexpected(request: Request, exc: Exception) -> Response:
    return JSONResponse({"internal": True}, status_code=500)


class _App(FastAPI):
    ahead = Ahead(())

    async def __call__(self, scope, receive, send):  # type: ignore[no-untyped-def]
        route = self.ahead.match(scope)
        if route is None:
            await super().__call__(scope, receive, send)
        else:
            await self.ahead.serve(self, route, scope, receive, send)


def _app(*, ahead: bool) -> _App:
    app = _App()
    app.router.routes.insert(0, ROUTE)
    app.add_exception_handler(Handled, _handled)
    app.add_exception_handler(HTTPException, _http)
    app.add_exception_handler(418, _teapot)
    app.add_exception_handler(Exception, _unexpected)
    if ahead:
        app.ahead = Ahead([ROUTE], prefix="/hot/")
    return app


async def _answer(app: _App, method: str, path: str) -> tuple[int, bytes, str | None]:
    """Status, body and the error that reached the server (its type's name), if any."""
    raised: list[str] = []

    async def server(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await app(scope, receive, send)
        except Exception as exc:
            raised.append(type(exc).__name__)
            raise

    transport = httpx.ASGITransport(app=server, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        got = await client.request(method, path)
    return got.status_code, got.content, raised[0] if raised else None


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/hot/ok"),
        ("GET", "/hot/handled"),
        ("GET", "/hot/child"),
        ("GET", "/hot/http404"),
        ("GET", "/hot/http418"),
        ("GET", "/hot/unexpected"),
        ("POST", "/hot/ok"),  # not taken ahead: the stack's 405
        ("GET", "/hot/"),
        ("GET", "/elsewhere"),
    ],
)
def test_a_route_ahead_answers_as_behind_the_stack(method: str, path: str) -> None:
    async def both() -> tuple[tuple[int, bytes, str | None], tuple[int, bytes, str | None]]:
        return await _answer(_app(ahead=True), method, path), await _answer(_app(ahead=False), method, path)

    ahead, behind = asyncio.run(both())
    assert ahead == behind


def test_only_a_request_a_route_takes_wholly_is_answered_ahead() -> None:
    ahead = Ahead([ROUTE], prefix="/hot/")
    get: dict[str, Any] = {"type": "http", "method": "GET", "path": "/hot/x", "root_path": "", "headers": []}
    assert ahead.match(get) is ROUTE and get["path_params"] == {"what": "x"}
    assert ahead.match({**get, "method": "POST"}) is None
    assert ahead.match({**get, "path": "/cold/x"}) is None
    assert ahead.match({**get, "root_path": "/api"}) is None  # the stack's root_path handling
    assert ahead.match({"type": "lifespan"}) is None
