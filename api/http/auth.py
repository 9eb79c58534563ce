"""API keys with scopes. Without configured keys the API is open but bound to loopback only."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel

from tributary.api.http.problems import Problem, ProblemBody
from tributary.api.http.state import settings_of
from tributary.api.settings.config import ApiSettings

__all__ = ["AUTH_RESPONSES", "Scope", "error", "require"]

Scope = Literal["read", "write", "admin"]


def error(description: str, model: type[BaseModel] = ProblemBody) -> dict[str, Any]:
    """An OpenAPI `responses=` entry for an error status: a problem (`application/problem+json`,
    see `problems.document_problems`)."""
    return {"model": model, "description": description}


# Declared on every route that depends on `require`, so the OpenAPI lists the statuses it can answer.
AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: error("missing or unknown API key"),
    403: error("the API key lacks the route's scope"),
}


def _scopes_for(settings: ApiSettings, presented: str) -> set[str] | None:
    for key in settings.keys:
        if hmac.compare_digest(key.key.encode(), presented.encode()):
            return set(key.scopes)
    return None


def require(scope: Scope) -> Callable[[Request], Awaitable[None]]:
    """A dependency: 401 without a valid key, 403 when the key lacks `scope` (admin implies all).
    A coroutine (it does no I/O): FastAPI runs a plain function dependency in its thread pool, a
    thread hop per request."""

    async def check(request: Request) -> None:
        settings = (await settings_of(request)).api
        if not settings.keys:
            return
        header = request.headers.get("authorization", "")
        presented = header[7:] if header.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        scopes = _scopes_for(settings, presented) if presented else None
        if scopes is None:
            raise Problem(
                401,
                "unauthorized",
                "missing or unknown API key (send Authorization: Bearer <key>)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if scope not in scopes and "admin" not in scopes:
            raise Problem(403, "forbidden", f"this API key lacks the {scope!r} scope")

    return check
