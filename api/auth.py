"""API keys with scopes. Without configured keys the API is open but bound to loopback only."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Literal

from fastapi import HTTPException, Request

from api.config import ApiSettings

__all__ = ["Scope", "require"]

Scope = Literal["read", "write", "admin"]


def _scopes_for(settings: ApiSettings, presented: str) -> set[str] | None:
    for key in settings.keys:
        if hmac.compare_digest(key.key.encode(), presented.encode()):
            return set(key.scopes)
    return None


def require(scope: Scope) -> Callable[[Request], None]:
    """A dependency: 401 without a valid key, 403 when the key lacks `scope` (admin implies all)."""

    def check(request: Request) -> None:
        settings: ApiSettings = request.app.state.settings.api
        if not settings.keys:
            return
        header = request.headers.get("authorization", "")
        presented = header[7:] if header.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        scopes = _scopes_for(settings, presented) if presented else None
        if scopes is None:
            raise HTTPException(
                401,
                "missing or unknown API key (send Authorization: Bearer <key>)",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if scope not in scopes and "admin" not in scopes:
            raise HTTPException(403, f"this API key lacks the {scope!r} scope")

    return check
