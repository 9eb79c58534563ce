"""`GET /views/{name}` is served ahead of FastAPI's route and middleware stack by a plain route
(`routes_views.VIEW_ROUTE`, answered by `app.Service.ahead`): it answers every request as FastAPI's
documented route does (status, headers, body bytes), HEAD included, in far fewer Python calls on the
event loop. Both apps serve the same real database."""

from __future__ import annotations

import asyncio
import base64
import cProfile
import pstats
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from fastapi.routing import APIRoute
from psycopg import sql

from tests.integration.api.counted import Counted
from tributary.api.http import routes_views
from tributary.api.http.ahead import Ahead
from tributary.api.http.app import Service, create_app
from tributary.api.settings.config import ApiKey, ApiSettings, LogSettings, ProjectionSettings, Settings
from tributary.projections.definition import Projection, Table
from tributary.projections.store import Store

pytestmark = pytest.mark.integration

READ, WRITE = {"Authorization": "Bearer reader"}, {"Authorization": "Bearer writer"}
COLUMNS = {"id": "bigint", "name": "text", "amount": "numeric(12,2)", "note": "text"}
MODULE = f"""
from tributary.projections.definition import Projection, Table

COLUMNS = {COLUMNS!r}
PROJECTIONS = [
    Projection(name="things", version=1, topics=("none",), table=Table.of(COLUMNS, ["id"]), build=len),
    Projection(name="unbuilt", version=1, topics=("none",), table=Table.of(COLUMNS, ["id"]), build=len),
]
"""
ROWS = 250


@pytest.fixture
def views_db(fresh_db: str) -> Iterator[str]:
    """A database with the view `things` built (ROWS rows) the way the projection runner leaves it."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        store = Store(conn)
        store.ensure()
        projection = Projection(name="things", version=1, topics=("none",), table=Table.of(COLUMNS, ["id"]), build=len)
        build = store.new_build(projection)
        store.swap(build)
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO {} (id, name, amount, note) VALUES (%s, %s, %s, %s)").format(
                    sql.Identifier("views", build.table_name)
                ),
                [
                    (i, f"n{i % 7}", Decimal(i % 40) * Decimal("1.25"), None if i % 5 == 0 else f"x{i}")
                    for i in range(1, ROWS + 1)
                ],
            )
    yield fresh_db


def _app(dsn: str, tmp: Path, served_by: str) -> Service:
    """The service's app, its view pages served by `VIEW_ROUTE` ahead of FastAPI's middleware stack
    (`ours`), by `VIEW_ROUTE` matched first in the route table, behind that stack (`route_first`), by
    FastAPI's documented route in its router (`fastapi`), or by a copy of that route matched first, as
    `VIEW_ROUTE` is (`fastapi_first`: only the request handling differs)."""
    module = tmp / "things.py"
    module.write_text(MODULE)
    settings = Settings(
        api=ApiSettings(keys=(ApiKey(key="reader", scopes=("read",)), ApiKey(key="writer", scopes=("write",)))),
        projections=ProjectionSettings(modules=(str(module),)),
        log=LogSettings(root=tmp / "log"),
    )
    app = create_app(settings, dsn=dsn)
    assert isinstance(app, Service)
    if served_by != "ours":
        app.ahead = Ahead(())
    if served_by not in ("ours", "route_first"):
        app.router.routes[:] = [r for r in app.router.routes if r is not routes_views.VIEW_ROUTE]
    if served_by == "fastapi_first":
        documented = next(
            r for r in routes_views.router.routes if isinstance(r, APIRoute) and r.path == "/views/{name}"
        )
        app.add_api_route(
            documented.path,
            documented.endpoint,
            methods=["GET"],
            responses=documented.responses,
            include_in_schema=False,
        )
        app.router.routes.insert(0, app.router.routes.pop())
    return app


@asynccontextmanager
async def _clients(dsn: str, tmp: Path, *served_by: str) -> AsyncIterator[list[tuple[httpx.AsyncClient, Counted]]]:
    """A client of each app (see `_app`), all started."""
    async with AsyncExitStack() as stack:
        clients = []
        for served in served_by:
            folder = tmp / served
            folder.mkdir()
            app = _app(dsn, folder, served)
            await stack.enter_async_context(app.router.lifespan_context(app))
            counted = Counted(app)
            transport = httpx.ASGITransport(app=counted, raise_app_exceptions=False)
            client = await stack.enter_async_context(httpx.AsyncClient(transport=transport, base_url="http://t"))
            clients.append((client, counted))
        yield clients


def _comparable(response: httpx.Response) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers (the request id aside: each app numbers its own) and the body's bytes."""
    headers = sorted((k, v) for k, v in response.headers.items() if k != "x-request-id")
    return response.status_code, headers, response.content


def _cursor(values: list[Any]) -> str:
    """A cursor as the route spells one (a JSON list in URL-safe base64), of values chosen here."""
    return base64.urlsafe_b64encode(orjson.dumps(values)).decode().rstrip("=")


# (path with its query, headers): each answer of the route, its errors and its successes.
REQUESTS: list[tuple[str, dict[str, str]]] = [
    ("/views/things", READ),
    ("/views/things?id=7", READ),
    ("/views/things?id=5", {"X-API-Key": "reader"}),
    ("/views/things?id=100000", READ),
    ("/views/things?limit=100", READ),
    ("/views/things?limit=1", READ),
    ("/views/things?limit=1000", READ),
    ("/views/things?limit=%2B3", READ),
    ("/views/things?limit=%203%20", READ),
    ("/views/things?limit=0", READ),
    ("/views/things?limit=1001", READ),
    ("/views/things?limit=-1", READ),
    ("/views/things?limit=abc", READ),
    ("/views/things?limit=1.5", READ),
    ("/views/things?limit=", READ),
    ("/views/things?limit=" + "9" * 30, READ),
    ("/views/things?limit=2&limit=x", READ),
    ("/views/things?id=abc", READ),
    ("/views/things?id=%00", READ),
    ("/views/things?id__gte=10&limit=5", READ),
    ("/views/things?id__gt=10&id__lte=20&name=n3", READ),
    ("/views/things?amount__lt=5&order_by=-amount&limit=7", READ),
    ("/views/things?note__ne=x9&order_by=note&limit=4", READ),
    ("/views/things?bogus=1", READ),
    ("/views/things?id__xx=1&zzz=2", READ),
    ("/views/things?id__=1", READ),
    ("/views/things?order_by=-id&limit=3", READ),
    ("/views/things?order_by=nope", READ),
    ("/views/things?order_by=--id", READ),
    ("/views/things?order_by=", READ),
    ("/views/things?limit=3&cursor=" + _cursor([3]), READ),
    ("/views/things?order_by=note&limit=3&cursor=" + _cursor([None, 10]), READ),
    ("/views/things?order_by=-note&limit=3&cursor=" + _cursor(["x9", 9]), READ),
    ("/views/things?cursor=" + _cursor([1, 2]), READ),
    ("/views/things?cursor=***", READ),
    ("/views/things?cursor=" + _cursor([True]), READ),
    ("/views/things?cursor=", READ),
    ("/views/th%69ngs?id=1", READ),
    ("/views/nope", READ),
    ("/views/nope?limit=abc", READ),
    ("/views/unbuilt", READ),
    ("/views/", READ),
    # keys: none, unknown, another scope, before any parameter is looked at
    ("/views/things", {}),
    ("/views/things?limit=abc", {}),
    ("/views/things", {"Authorization": "Bearer nope"}),
    ("/views/things", {"X-API-Key": "nope"}),
    ("/views/things", WRITE),
    ("/views/nope?limit=abc", WRITE),
    ("/views/things", {"Authorization": "bearer reader"}),
]


def test_the_view_route_answers_as_fastapis_route(views_db: str, tmp_path: Path) -> None:
    async def go() -> None:
        async with _clients(views_db, tmp_path, "ours", "fastapi") as [(ours, _), (theirs, _)]:
            for method in ("GET", "HEAD"):
                for path, headers in REQUESTS:
                    got = await ours.request(method, path, headers=headers)
                    expected = await theirs.request(method, path, headers=headers)
                    assert _comparable(got) == _comparable(expected), (method, path, headers)
            first = (await ours.get("/views/things?limit=50", headers=READ)).json()
            assert len(first["rows"]) == 50 and first["next_cursor"]
            after = f"/views/things?limit=50&cursor={first['next_cursor']}"
            got, expected = await ours.get(after, headers=READ), await theirs.get(after, headers=READ)
            assert _comparable(got) == _comparable(expected)
            assert got.json()["rows"][0]["id"] == 51
            for method in ("POST", "PUT", "DELETE", "PATCH"):  # the documented route's 405 and its Allow
                got, expected = (
                    await ours.request(method, "/views/things", headers=READ),
                    await theirs.request(method, "/views/things", headers=READ),
                )
                assert _comparable(got) == _comparable(expected)
                assert got.status_code == 405 and got.headers["allow"] == "GET"

    asyncio.run(go())


async def _app_calls(client: httpx.AsyncClient, counted: Counted, path: str) -> float:
    """The app's Python calls per request on the event loop's thread: a count, the same on any
    machine and load (the query prepared and the route warmed up first). The fewest of several
    batches: the apps' background tasks (status refresh, pools) run on the same thread now and then."""
    for _ in range(3):
        assert (await client.get(path, headers=READ)).status_code == 200
    batches = []
    for _ in range(6):
        counted.profile, counted.counting = cProfile.Profile(), True
        for _ in range(10):
            answer = await client.get(path, headers=READ)
            assert answer.status_code == 200, answer.text
        counted.counting = False
        calls: int = pstats.Stats(counted.profile).total_calls  # type: ignore[attr-defined]
        batches.append(calls / 10)
    return min(batches)


def test_a_view_page_takes_far_fewer_python_calls_than_fastapis_route(views_db: str, tmp_path: Path) -> None:
    async def measure() -> dict[str, float]:
        variants = ("ours", "route_first", "fastapi", "fastapi_first")
        async with _clients(views_db, tmp_path, *variants) as clients:
            served = zip(variants, clients, strict=True)
            return {name: await _app_calls(*client, "/views/things?id=42") for name, client in served}

    calls = asyncio.run(measure())
    # ahead of FastAPI's middleware stack: its entry, error and exception layers, route table (≈ 70 calls)
    assert calls["ours"] < 0.92 * calls["route_first"], calls
    assert calls["ours"] < 0.7 * calls["fastapi"], calls
    # matched first as well, FastAPI's request handling alone is more than a fifth of the calls
    assert calls["ours"] < 0.85 * calls["fastapi_first"], calls
