"""The one error shape of the HTTP API: RFC 9457 problem details (`application/problem+json`).

Every 4xx and 5xx body is `{"type", "title", "status", "detail", "code", …}`: `code` is a
snake_case name a client can branch on (`type` is `urn:tributary:problem:<code>`), `title` is the
same for every problem of a code, `detail` is one line for a person; some codes add members (a
version conflict: `stream`, `expected`, `actual`, `attempts`). Routes raise `Problem`; FastAPI's
and Starlette's own errors (`HTTPException`, validation, 404/405 of routing) are rendered here too.
"""

from __future__ import annotations

import http
import json
import math
from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from tributary.jsonvalue import JsonObject, JsonValue

__all__ = [
    "MEDIA_TYPE",
    "TITLES",
    "TYPE_PREFIX",
    "ConflictBody",
    "Problem",
    "ProblemBody",
    "carriable",
    "code_for_status",
    "document_problems",
    "encode",
    "handle_problem",
    "problem_body",
    "problem_response",
]

MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:tributary:problem:"

# One title per code (RFC 9457 §3.1.3: it does not change from occurrence to occurrence).
TITLES: dict[str, str] = {
    "bad_request": "Bad request",
    "unauthorized": "Missing or unknown API key",
    "forbidden": "API key lacks the scope",
    "not_found": "Not found",
    "method_not_allowed": "Method not allowed",
    "request_timeout": "Request timed out",
    "body_too_large": "Request body too large",
    "headers_too_large": "Request headers too large",
    "invalid_request": "Request does not fit the route's schema",
    "internal_error": "Internal error",
    "unavailable": "Service unavailable",
    "not_initialized": "Service database not initialized",
    "conflict": "Version conflict",
    "unknown_stream_type": "Unknown stream type",
    "unknown_stream": "Unknown stream",
    "stream_deleted": "Stream deleted",
    "metadata_conflict": "Stream metadata version conflict",
    "history_hidden": "Stream history hidden",
    "unknown_position": "Unknown position",
    "unknown_command": "Unknown command",
    "invalid_command": "Invalid command",
    "invalid_value": "Invalid value",
    "rejected": "Command rejected",
    "idempotency_mismatch": "Command id reused for another command",
    "partial_duplicate_batch": "Batch partly appended before",
    "unknown_view": "Unknown view",
    "view_not_built": "View not built yet",
    "invalid_query": "Invalid view query",
    "unknown_projection": "Unknown projection",
    "projection_not_loadable": "Projection file does not load",
    "unknown_rebuild": "Unknown rebuild",
    "log_unreadable": "Log cannot be read",
    "unknown_member": "Unknown group member",
    "fenced": "Stale generation",
    "not_assigned": "Partition not assigned",
    "offset_out_of_range": "Offset out of range",
    "group_not_empty": "Group has live members",
    "invalid": "Invalid consumer request",
}

_BY_STATUS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "body_too_large",
    422: "invalid_request",
    431: "headers_too_large",
    500: "internal_error",
    503: "unavailable",
}


class ProblemBody(BaseModel):
    """An error answer (RFC 9457 problem details, `application/problem+json`); some codes add members."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="`urn:tributary:problem:<code>`", examples=["urn:tributary:problem:not_found"])
    title: str = Field(description="The same for every problem of this code.", examples=["Not found"])
    status: int = Field(description="The HTTP status.", examples=[404])
    detail: str = Field(description="One line for a person: what happened and what to do.")
    code: str = Field(description="What a client branches on (snake_case).", examples=["not_found"])


class ConflictBody(ProblemBody):
    """409 `conflict`: the stream was not at the expected version (after `attempts` tries)."""

    stream: str
    expected: int | str
    actual: int
    attempts: int


def code_for_status(status: int) -> str:
    """The code of a problem that only its status describes (FastAPI's and Starlette's own errors)."""
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        return "internal_error" if status >= 500 else "bad_request"
    return phrase.lower().replace(" ", "_").replace("-", "_")


def problem_body(status: int, code: str, detail: str, **extensions: JsonValue) -> JsonObject:
    """The JSON object of one problem; `extensions` are the code's own members."""
    title = TITLES.get(code) or http.HTTPStatus(status).phrase
    return {"type": TYPE_PREFIX + code, "title": title, "status": status, "detail": detail, "code": code, **extensions}


def encode(body: JsonObject) -> bytes:
    """UTF-8 JSON of a body that may quote a client's input (`carriable`); stdlib `json`, whose depth
    is Python's recursion limit (a `RecursionError` the caller may catch), not orjson's 255."""
    return json.dumps(carriable(body), ensure_ascii=False, separators=(",", ":")).encode()


def carriable(value: JsonValue) -> JsonValue:
    """`value` as JSON can carry it in UTF-8: an unpaired UTF-16 surrogate (JSON's `\\ud83d`
    escape decodes to one) becomes U+FFFD, NaN and infinities their names as strings."""
    if isinstance(value, str):
        if value.isascii():
            return value
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {carriable(k): carriable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [carriable(v) for v in value]
    return value


def problem_response(
    status: int, code: str, detail: str, *, headers: Mapping[str, str] | None = None, **extensions: JsonValue
) -> Response:
    """A problem as a response (`application/problem+json`)."""
    return Response(
        encode(problem_body(status, code, detail, **extensions)),
        status_code=status,
        media_type=MEDIA_TYPE,
        headers=dict(headers) if headers else None,
    )


class Problem(Exception):
    """Raised by a route to answer with a problem: `status`, `code`, a one-line `detail`, and the
    code's own members as keyword arguments."""

    def __init__(
        self, status: int, code: str, detail: str, *, headers: dict[str, str] | None = None, **extensions: JsonValue
    ) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers, self.extensions = status, code, detail, headers, extensions

    def response(self) -> Response:
        return problem_response(self.status, self.code, self.detail, headers=self.headers, **self.extensions)


async def handle_problem(request: Request, exc: Exception) -> Response:
    """The app's handler of `Problem`."""
    assert isinstance(exc, Problem)
    return exc.response()


def document_problems(schema: dict[str, Any]) -> None:
    """Have the OpenAPI document say what the server sends: every 4xx/5xx body is
    `application/problem+json` (FastAPI files each declared model under `application/json`), and
    FastAPI's own 422 is a problem too (in place)."""
    components: dict[str, Any] = schema.setdefault("components", {}).setdefault("schemas", {})
    for path in schema.get("paths", {}).values():
        for op in path.values():
            for status, answer in op.get("responses", {}).items():
                if str(status)[:1] not in ("4", "5"):
                    continue
                content = answer.setdefault("content", {})
                found = content.pop("application/json", None) or {}
                ref = found.get("schema", {}).get("$ref", "")
                if not ref or ref.endswith("/HTTPValidationError"):
                    found = {"schema": {"$ref": "#/components/schemas/ProblemBody"}}
                content[MEDIA_TYPE] = found
            op["responses"].setdefault(  # any route, when the server fails: the details are in its log
                "500",
                {
                    "description": "`internal_error`: see the server log (under the request's `X-Request-ID`)",
                    "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/ProblemBody"}}},
                },
            )
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
