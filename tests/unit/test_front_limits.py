"""The app's front layer (`front.Front`) refuses a body past `[api] max_body_bytes` while it streams
(no Content-Length to refuse it by), with the same problem as one refused by its Content-Length."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from tributary.api.http.app import create_app
from tributary.api.settings.config import Settings

pytestmark = pytest.mark.unit

LIMIT = 4096


async def _chunks(total: int) -> AsyncIterator[bytes]:
    """A JSON body of `total` bytes in pieces, sent chunked (no Content-Length)."""
    yield b'{"type": "open", "data": {"owner": "'
    sent = 36
    while sent < total:
        yield b"x" * 1000
        sent += 1000
    yield b'"}}'


def _post(content: bytes | AsyncIterator[bytes]) -> httpx.Response:
    app = create_app(Settings.model_validate({"api": {"max_body_bytes": LIMIT}}), dsn="postgresql://unused.invalid/x")

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.post("/commands/account/a-1", content=content)

    return asyncio.run(go())


def test_a_streamed_body_past_the_limit_is_a_413_problem() -> None:
    streamed = _post(_chunks(3 * LIMIT))
    assert "content-length" not in streamed.request.headers
    by_length = _post(b"x" * (3 * LIMIT))
    assert streamed.status_code == by_length.status_code == 413, streamed.text
    assert streamed.headers["content-type"] == by_length.headers["content-type"] == "application/problem+json"
    assert streamed.json() == by_length.json()
    assert streamed.json()["code"] == "body_too_large"
