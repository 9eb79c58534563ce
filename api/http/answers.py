"""The answers the event store's routes share: a body in the event store's JSON codec, and the one
mapping of the event store's errors to problems (commands, streams, lifecycle, admin)."""

from __future__ import annotations

from fastapi.responses import Response

from tributary.api.http.problems import Problem
from tributary.eventstore.errors import (
    CommandRejected,
    ConcurrencyConflict,
    EventStoreError,
    HistoryHidden,
    IdempotencyMismatch,
    InvalidCommand,
    InvalidValue,
    MetadataConflict,
    PartialDuplicateBatch,
    StoreUnavailable,
    StreamDeleted,
    StreamNotFound,
    UnknownCommand,
    UnknownStreamType,
)
from tributary.eventstore.model import dumps
from tributary.jsonvalue import JsonValue

__all__ = ["event_store_problem", "json_response"]


def json_response(body: JsonValue, status: int = 200) -> Response:
    """The body in the event store's JSON codec (decimals as exact strings), sent as it is encoded."""
    return Response(dumps(body), status_code=status, media_type="application/json")


def event_store_problem(exc: EventStoreError) -> Problem:
    """The one mapping of the event store's errors to problems."""
    if isinstance(exc, ConcurrencyConflict):
        return Problem(
            409,
            "conflict",
            str(exc),
            stream=exc.stream_id,
            expected=exc.expected,
            actual=exc.actual,
            attempts=exc.attempts,
        )
    if isinstance(exc, StoreUnavailable):
        return Problem(503, "unavailable", str(exc))
    if isinstance(exc, StreamDeleted):
        return Problem(410, "stream_deleted", str(exc), stream=exc.stream_id)
    if isinstance(exc, HistoryHidden):
        return Problem(409, "history_hidden", str(exc), stream=exc.stream_id, missing_from=exc.missing_from)
    if isinstance(exc, StreamNotFound):
        return Problem(404, "unknown_stream", str(exc))
    if isinstance(exc, MetadataConflict):
        return Problem(
            409, "metadata_conflict", str(exc), stream=exc.stream_id, expected=exc.expected, actual=exc.actual
        )
    if isinstance(exc, InvalidValue):
        return Problem(422, "invalid_value", str(exc), field=exc.field)
    if isinstance(exc, UnknownStreamType):
        return Problem(404, "unknown_stream_type", str(exc))
    if isinstance(exc, CommandRejected):
        return Problem(422, "rejected", exc.reason, rule=exc.rule)
    if isinstance(exc, InvalidCommand):
        fields = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors]
        return Problem(422, "invalid_command", str(exc), fields=fields)
    if isinstance(exc, UnknownCommand):
        return Problem(422, "unknown_command", str(exc))
    if isinstance(exc, IdempotencyMismatch):
        return Problem(422, "idempotency_mismatch", str(exc))
    if isinstance(exc, PartialDuplicateBatch):
        return Problem(422, "partial_duplicate_batch", str(exc))
    return Problem(400, "bad_request", str(exc))
