"""The HTTP app's answers that need no database: HEAD, trailing slashes and the Host header, and
request bodies FastAPI refuses before a route runs (including ones whose echo must stay encodable)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tributary.api.http.app import create_app
from tributary.api.settings.config import Settings

pytestmark = pytest.mark.unit

APP = create_app(Settings(), dsn="postgresql://unused.invalid/none")  # never started: no database


def _send(method: str, path: str, **kwargs: object) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=APP, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.request(method, path, **kwargs)  # type: ignore[arg-type]

    return asyncio.run(go())


@pytest.mark.parametrize("path", ["/healthz", "/openapi.json", "/"])
def test_head_answers_like_get_without_a_body(path: str) -> None:
    get, head = _send("GET", path), _send("HEAD", path)
    assert get.status_code == head.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    assert head.headers["content-length"] == str(len(get.content))


def test_head_requests_are_counted_by_their_route() -> None:
    _send("HEAD", "/healthz")
    assert APP.metrics.http_requests.counts.get(("HEAD", "/healthz", 200), 0) >= 1  # type: ignore[attr-defined]


def test_head_on_readyz_is_not_a_405() -> None:
    assert _send("HEAD", "/readyz").status_code == _send("GET", "/readyz").status_code != 405


def test_head_on_a_post_only_route_is_still_405() -> None:
    assert _send("HEAD", "/commands/account/a").status_code == 405


def test_a_trailing_slash_never_redirects_to_the_host_header() -> None:
    got = _send("GET", "/views/", headers={"Host": "evil.example"})
    assert got.status_code == 404 and "location" not in got.headers


def test_expected_version_beyond_bigint_is_a_422() -> None:
    got = _send("POST", "/commands/account/a", json={"type": "open", "expected_version": 2**64})
    assert got.status_code == 422 and got.json()["errors"][0]["loc"][:2] == ["body", "expected_version"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"type": "open", "\\ud83d": 1}',  # an unknown field named by a lone surrogate (echoed as loc and input)
        b'{"type": "\\ud83d' + b"x" * 200 + b'"}',  # too long: the input is echoed
        b'{"type": "open", "data": "\\udc00"}',  # not an object: echoed
        b'"\\ud83d"',
    ],
)
def test_a_refused_body_with_a_lone_surrogate_is_a_422(body: bytes) -> None:
    got = _send("POST", "/commands/account/a", content=body, headers={"content-type": "application/json"})
    assert got.status_code == 422, got.text
    assert "\ufffd" in got.text  # the surrogate echoed as U+FFFD, the body valid UTF-8


def test_a_deeply_nested_refused_body_is_a_422() -> None:
    body = b'{"type": "open", "data": ' + b"[" * 900 + b"]" * 900 + b"}"
    got = _send("POST", "/commands/account/a", content=body, headers={"content-type": "application/json"})
    assert got.status_code == 422, got.text
    assert got.json()["errors"][0]["loc"] == ["body", "data"]


@pytest.mark.parametrize("depth", [10, 900])
def test_a_deeply_nested_refused_body_with_a_lone_surrogate_is_a_422(depth: int) -> None:
    body = b'{"type": "open", "data": ' + b"[" * depth + b'"\\ud83d"' + b"]" * depth + b"}"
    got = _send("POST", "/commands/account/a", content=body, headers={"content-type": "application/json"})
    assert got.status_code == 422, got.text
    assert got.json()["errors"][0]["loc"] == ["body", "data"]


@pytest.mark.parametrize("body", [b"Infinity", b"-Infinity", b"NaN", b'{"type": "open", "expected_version": NaN}'])
def test_a_refused_body_with_nan_or_infinity_is_a_422(body: bytes) -> None:
    got = _send("POST", "/commands/account/a", content=body, headers={"content-type": "application/json"})
    assert got.status_code == 422, got.text
