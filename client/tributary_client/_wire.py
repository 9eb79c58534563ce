"""The HTTP wire of the consumer-group API: path segments, server-sent events, and the server's
problem details (RFC 9457) turned into one-line errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx

from tributary_client._types import ConsumerError

__all__ = ["error_code", "message", "problem", "raise_for", "segment", "sse_events"]


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str, str | None, str]]:
    """(event, id, data) of each server-sent event in `lines` (comments and `retry:` skipped)."""
    event, event_id = "message", None
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield event, event_id, "\n".join(data)
            event, event_id, data = "message", None, []
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "id":
            event_id = value
        elif name == "data":
            data.append(value)


def segment(value: str) -> str:
    """`value` as one URL path segment (group names and member ids may hold `/`)."""
    return quote(value, safe="")


def problem(response: httpx.Response) -> dict[str, Any]:
    """The server's problem details (RFC 9457) of an error answer; empty when the body is not one
    (a proxy's page, say)."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def error_code(response: httpx.Response) -> str | None:
    """The contract's error code (`fenced`, `unknown_member`, …) of an error answer, if any."""
    code = problem(response).get("code")
    return str(code) if code else None


def message(response: httpx.Response) -> str:
    """The problem's one-line `detail`, else the status."""
    detail = problem(response).get("detail")
    return str(detail) if detail else f"HTTP {response.status_code}"


def raise_for(response: httpx.Response, what: str) -> None:
    """An error answer as one ConsumerError line naming the step (`join`, `fetch`, …)."""
    if response.status_code >= 400:
        raise ConsumerError(f"{what} failed with HTTP {response.status_code}: {message(response)}")
