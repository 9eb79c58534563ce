"""`POST /commands/…` is served ahead of FastAPI's route by a plain route that reads, checks and
validates the request itself (`routes_commands.COMMAND_ROUTE`): it answers every request as FastAPI's
documented route does (status, content type, problem body), in about half of its Python calls on
the event loop. Both apps run against their own real database, fed the same requests."""

from __future__ import annotations

import asyncio
import pstats
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.routing import Route

from tests.integration.api.counted import Counted
from tests.pg import PgServer, fresh_database
from tributary.api.http.app import create_app
from tributary.api.http.domains import GENERIC_COMMAND_PATH
from tributary.api.settings.config import ApiKey, ApiSettings, EventStoreSettings, LogSettings, Settings
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.integration

WRITE, READ = {"Authorization": "Bearer writer"}, {"Authorization": "Bearer reader"}
JSON = {"content-type": "application/json"}
# Event fields that differ between two databases fed the same commands.
_VOLATILE = ("id", "occurred_at", "recorded_at", "correlation_id", "causation_id")


def _app(dsn: str, log: Path, *, fastapi_only: bool) -> FastAPI:
    """The service's app; `fastapi_only`: without the command route matched first (the routes of the
    app's head that the OpenAPI document does not list), so FastAPI's documented route answers."""
    settings = Settings(
        api=ApiSettings(keys=(ApiKey(key="writer", scopes=("write",)), ApiKey(key="reader", scopes=("read",)))),
        eventstore=EventStoreSettings(modules=("tributary.eventstore.examples.bank",)),
        log=LogSettings(root=log),
    )
    app = create_app(settings, dsn=dsn)
    if fastapi_only:
        app.router.routes[:] = [r for r in app.router.routes if not _undocumented_command_route(r)]
    return app


def _undocumented_command_route(route: Any) -> bool:
    return isinstance(route, Route) and route.path == GENERIC_COMMAND_PATH and not route.include_in_schema


@pytest.fixture
def two_databases(pg_server: PgServer) -> Iterator[tuple[str, str]]:
    with fresh_database(pg_server) as first, fresh_database(pg_server) as second:
        run_migrations(first)
        run_migrations(second)
        yield first, second


@asynccontextmanager
async def _clients(
    dsns: tuple[str, str], tmp_path: Path
) -> AsyncIterator[tuple[tuple[httpx.AsyncClient, Counted], tuple[httpx.AsyncClient, Counted]]]:
    """Clients of the app (served by the command route) and of the app without it, both started."""
    async with AsyncExitStack() as stack:
        clients = []
        for dsn, fastapi_only in zip(dsns, (False, True), strict=True):
            app = _app(dsn, tmp_path / f"log-{fastapi_only}", fastapi_only=fastapi_only)
            await stack.enter_async_context(app.router.lifespan_context(app))
            counted = Counted(app)
            transport = httpx.ASGITransport(app=counted, raise_app_exceptions=False)
            client = await stack.enter_async_context(httpx.AsyncClient(transport=transport, base_url="http://t"))
            clients.append((client, counted))
        yield clients[0], clients[1]


def _comparable(response: httpx.Response) -> tuple[int, str | None, str | None, Any]:
    """Status, content type, `Allow` and the body, without what two databases give differently."""
    try:
        body: Any = response.json()
    except ValueError:
        body = response.content
    if response.status_code == 200:
        for event in body["events"]:
            for key in _VOLATILE:
                event.pop(key, None)
                event["metadata"].pop(key, None)
    return response.status_code, response.headers.get("content-type"), response.headers.get("allow"), body


NESTED = b'{"type": "open", "data": {"owner": "x", "deep": ' + b"[" * 300 + b"]" * 300 + b"}}"
# (path, headers, body): each error the route can answer before and after the handler, and successes.
REQUESTS: list[tuple[str, dict[str, str], bytes]] = [
    ("/commands/account/a-1", {**WRITE, **JSON}, b'{"type": "open", "data": {"owner": "ada"}}'),
    ("/commands/account/a-1", {**WRITE, **JSON}, b'{"type": "deposit", "data": {"amount": "10.25"}}'),
    ("/commands/account/a-1", {**WRITE, **JSON}, b'{"type": "deposit", "data": {"amount": "1"}, "command_id": "c-1"}'),
    ("/commands/account/a-1", {**WRITE, **JSON}, b'{"type": "deposit", "data": {"amount": "1"}, "command_id": "c-1"}'),
    ("/commands/account/a-1", {**WRITE, **JSON}, b'{"type": "deposit", "data": {"amount": "2"}, "command_id": "c-1"}'),
    ("/commands/account/a-1", {**WRITE, **JSON}, b'{"type": "withdraw", "data": {"amount": "999"}}'),
    (
        "/commands/account/a-1",
        {**WRITE, **JSON},
        b'{"type": "deposit", "data": {"amount": "1"}, "expected_version": 1}',
    ),
    ("/commands/account/a-1", {**WRITE, **JSON}, b'{"type": "transfer", "data": {}}'),
    ("/commands/account/a-1", {**WRITE, **JSON}, b'{"type": "deposit", "data": {"amount": "-1"}}'),
    ("/commands/account/a-2", {**WRITE, **JSON}, b'{"type": "deposit", "data": {"amount": "1"}}'),
    ("/commands/nope/a-1", {**WRITE, **JSON}, b'{"type": "open", "data": {"owner": "x"}}'),
    ("/commands/account/a%00b", {**WRITE, **JSON}, b'{"type": "open", "data": {"owner": "x"}}'),
    ("/commands/account/" + "x" * 300, {**WRITE, **JSON}, b'{"type": "open", "data": {"owner": "x"}}'),
    # bodies: not JSON, JSON of another shape, what only json.loads reads, fields the schema refuses
    ("/commands/account/b", {**WRITE, **JSON}, b"{not json"),
    ("/commands/account/b", {**WRITE, **JSON}, b'{"type": "open"} trailing'),
    ("/commands/account/b", {**WRITE, **JSON}, b""),
    ("/commands/account/b", {**WRITE, **JSON}, b"[]"),
    ("/commands/account/b", {**WRITE, **JSON}, b"null"),
    ("/commands/account/b", {**WRITE, **JSON}, b'"open"'),
    ("/commands/account/b", {**WRITE, **JSON}, b'{"type": "open", "data": {"owner": "x", "overdraft_limit": NaN}}'),
    ("/commands/account/b", {**WRITE, **JSON}, b'{"type": "open", "data": {"owner": "x", "overdraft_limit": -1e400}}'),
    (
        "/commands/account/b",
        {**WRITE, **JSON},
        b'{"type": "open", "data": {"owner": "x", "n": 123456789012345678901234}}',
    ),
    ("/commands/account/b", {**WRITE, **JSON}, b'{"type": "open", "data": {"owner": "\\ud800"}}'),
    ("/commands/account/b", {**WRITE, **JSON}, b'{"type": "open", "data": {"owner": "\\u0000"}}'),
    ("/commands/account/b", {**WRITE, **JSON}, b'\xef\xbb\xbf{"type": "open", "data": {"owner": "bom"}}'),
    ("/commands/account/b", {**WRITE, **JSON}, '{"type": "open", "data": {"owner": "utf16"}}'.encode("utf-16")),
    ("/commands/account/b", {**WRITE, **JSON}, b'{"type": "\xff"}'),
    ("/commands/account/b", {**WRITE, **JSON}, b"[" * 5000),
    ("/commands/account/b", {**WRITE, **JSON}, NESTED),
    ("/commands/account/b", {**WRITE, **JSON}, b'{"data": {}}'),
    ("/commands/account/b", {**WRITE, **JSON}, b'{"type": "", "bogus": 1}'),
    ("/commands/account/b", {**WRITE, **JSON}, b'{"type": "open", "expected_version": false}'),
    ("/commands/account/b", {**WRITE, **JSON}, b'{"type": "open", "expected_version": "3"}'),
    ("/commands/account/b", {**WRITE, **JSON}, b'{"type": "open", "expected_version": 9007199254740992}'),
    ("/commands/account/b", {**WRITE, **JSON}, b'{"type": "open", "command_id": "", "headers": {"a": 1}}'),
    ("/commands/account/b", {**WRITE, **JSON}, b'{"type": "open", "data": [1, {"x": NaN}]}'),
    # content types: none (FastAPI's strict default: not read as JSON), others, JSON's variants
    ("/commands/account/c", WRITE, b'{"type": "open", "data": {"owner": "x"}}'),
    ("/commands/account/c", {**WRITE, "content-type": "text/plain"}, b'{"type": "open", "data": {"owner": "x"}}'),
    ("/commands/account/c", {**WRITE, "content-type": "application/merge-patch+json"}, b'{"type": "open"}'),
    ("/commands/account/d", {**WRITE, "content-type": "application/json; charset=utf-8"}, b'{"type": "open"}'),
    ("/commands/account/e", {**WRITE, "content-type": "Application/JSON"}, b'{"type": "open"}'),
    ("/commands/account/c", {**WRITE, "content-type": "application/json-seq"}, b'{"type": "open"}'),
    # keys: the body is read (and its JSON parsed) before the key is checked, validated after it
    ("/commands/account/k", JSON, b"{not json"),
    ("/commands/account/k", JSON, b'{"nope": 1}'),
    ("/commands/account/k", {**JSON, "Authorization": "Bearer wrong"}, b'{"type": "open"}'),
    ("/commands/account/k", {**READ, **JSON}, b'{"nope": 1}'),
    ("/commands/account/k", {**READ, **JSON}, b"{not json"),
    ("/commands/account/k", {**JSON, "X-API-Key": "writer"}, b'{"type": "open", "data": {"owner": "k"}}'),
]


def test_the_command_route_answers_as_fastapis_route(two_databases: tuple[str, str], tmp_path: Path) -> None:
    async def go() -> None:
        async with _clients(two_databases, tmp_path) as ((ours, _), (theirs, _)):
            for path, headers, body in REQUESTS:
                got = await ours.post(path, headers=headers, content=body)
                expected = await theirs.post(path, headers=headers, content=body)
                assert _comparable(got) == _comparable(expected), (path, headers, body[:80])
            for method in ("GET", "PUT", "DELETE"):  # the documented route's 405 and its Allow
                got, expected = (
                    await ours.request(method, "/commands/account/a-1"),
                    await theirs.request(method, "/commands/account/a-1"),
                )
                assert _comparable(got) == _comparable(expected)
                assert got.status_code == 405 and got.headers["allow"] == "POST"

    asyncio.run(go())


async def _app_calls(client: httpx.AsyncClient, counted: Counted, stream: str, commands: int) -> float:
    """The app's Python calls per command on the event loop's thread: a count, the same on any
    machine and load."""
    refused = await client.post(f"/commands/account/{stream}", headers=WRITE, json={"type": "open", "data": {}})
    assert refused.status_code == 422  # no owner: the route and its validation warmed up
    await client.post(f"/commands/account/{stream}", headers=WRITE, json={"type": "open", "data": {"owner": "p"}})
    counted.counting = True
    for _ in range(commands):
        sent = await client.post(
            f"/commands/account/{stream}", headers=WRITE, json={"type": "deposit", "data": {"amount": "1"}}
        )
        assert sent.status_code == 200, sent.text
    counted.counting = False
    calls: int = pstats.Stats(counted.profile).total_calls  # type: ignore[attr-defined]
    return calls / commands


def test_a_command_takes_far_fewer_python_calls_than_fastapis_route(
    two_databases: tuple[str, str], tmp_path: Path
) -> None:
    async def measure() -> tuple[float, float]:
        async with _clients(two_databases, tmp_path) as (ours, theirs):
            return await _app_calls(*ours, "p-1", 30), await _app_calls(*theirs, "p-1", 30)

    ours, theirs = asyncio.run(measure())
    assert ours < 0.7 * theirs, (ours, theirs)
