"""`GET /views/{name}` reads `limit`, `cursor` and `order_by` itself: its OpenAPI parameters and its
answers to any `limit` are those of a FastAPI route that declares them (`limit: int = 100,
cursor: str | None = None, order_by: str | None = None`), with the installed FastAPI and pydantic."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import given, settings
from hypothesis import strategies as st

from tributary.api.http.app import create_app
from tributary.api.http.routes_views import _limit
from tributary.api.settings.config import Settings

pytestmark = pytest.mark.unit

APP = create_app(Settings(), dsn="postgresql://unused.invalid/none")  # never started: no database
DECLARED = FastAPI()


@DECLARED.get("/views/{name}")
async def declared(name: str, limit: int = 100, cursor: str | None = None, order_by: str | None = None) -> Any:
    return {"limit": limit}


def _get(app: FastAPI, params: dict[str, str] | httpx.QueryParams) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.get("/views/things", params=params)

    return asyncio.run(go())


def test_openapi_parameters_as_declared_ones() -> None:
    ours = APP.openapi()["paths"]["/views/{name}"]["get"]["parameters"]
    assert ours == DECLARED.openapi()["paths"]["/views/{name}"]["get"]["parameters"]


LIMITS = ["100", "0", "-1", "1001", "ten", "", " 7 ", "1_0", "1.0", "1.5", "+5", "0x10", "1e3", "٣", "9" * 30]


@pytest.mark.parametrize("limit", LIMITS)
def test_limit_read_as_a_declared_int(limit: str) -> None:
    _same_answer(limit)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.sampled_from("0123456789 -+._eExX٣a\t"), max_size=6))
def test_any_limit_read_as_a_declared_int(limit: str) -> None:
    _same_answer(limit)


def _same_answer(limit: str) -> None:
    """A 422 with FastAPI's field errors (as the problem's `errors`) where the declared route refuses
    `limit`; otherwise the same value (the app, not started, then answers 503 or its own range check's 422)."""
    want = _get(DECLARED, {"limit": limit})
    got = _get(APP, {"limit": limit})
    if want.status_code == 422:
        assert (got.status_code, _field_errors(got)) == (422, want.json()["detail"])
    else:
        assert want.status_code == 200
        assert _limit({"limit": limit}) == want.json()["limit"]
        assert got.status_code == 503, got.text
    assert got.headers["x-request-id"]


def _field_errors(got: httpx.Response) -> Any:
    """FastAPI's field errors in the app's problem (`invalid_request`)."""
    assert got.headers["content-type"] == "application/problem+json" and got.json()["code"] == "invalid_request"
    return got.json()["errors"]


def test_absent_or_repeated_limit() -> None:
    assert _limit({}) == 100
    assert _get(DECLARED, {}).json() == {"limit": 100}
    last_bad = httpx.QueryParams([("limit", "5"), ("limit", "ten")])  # the last one counts
    want, got = _get(DECLARED, last_bad), _get(APP, last_bad)
    assert want.status_code == 422 and (got.status_code, _field_errors(got)) == (422, want.json()["detail"])
    last_good = httpx.QueryParams([("limit", "ten"), ("limit", "5")])
    assert _get(DECLARED, last_good).json() == {"limit": 5} and _get(APP, last_good).status_code == 503
