"""Events as stored and as appended, expected versions, and the JSON codec (exact decimals)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

import orjson

from tributary.jsonvalue import JsonValue

__all__ = ["AppendResult", "ExpectedVersion", "NewEvent", "RecordedEvent", "dumps", "event_json", "response_json"]

# Versions are 1-based: a stream's version is the number of events in it; no_stream == 0.
ExpectedVersion = Literal["any", "no_stream", "stream_exists"] | int


def _default(obj: object) -> str:
    if isinstance(obj, Decimal):
        return str(obj)  # money stays exact: a JSON string, never a float
    if isinstance(obj, uuid.UUID):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def dumps(obj: JsonValue) -> bytes:
    return orjson.dumps(obj, default=_default)


@dataclass(frozen=True, slots=True)
class NewEvent:
    type: str
    data: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)
    event_id: uuid.UUID = field(default_factory=uuid.uuid4)
    schema_version: int = 1
    occurred_at: datetime = field(default_factory=lambda: datetime.now(UTC))


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    position: int
    stream_id: str
    stream_type: str
    version: int
    event_id: uuid.UUID
    type: str
    schema_version: int
    data: dict[str, Any]
    metadata: dict[str, Any]
    occurred_at: datetime
    recorded_at: datetime


def event_json(e: RecordedEvent) -> dict[str, Any]:
    """The event as the API and the log show it."""
    return {
        "id": str(e.event_id),
        "stream": e.stream_id,
        "stream_type": e.stream_type,
        "version": e.version,
        "position": e.position,
        "type": e.type,
        "schema_version": e.schema_version,
        "data": e.data,
        "metadata": e.metadata,
        "occurred_at": e.occurred_at.isoformat().replace("+00:00", "Z"),
        "recorded_at": e.recorded_at.isoformat().replace("+00:00", "Z"),
    }


@dataclass(frozen=True, slots=True)
class AppendResult:
    stream_id: str
    version: int  # the stream's version after the append
    events: tuple[RecordedEvent, ...]
    duplicate: bool = False  # the same event ids were appended before: nothing new was written


def response_json(result: AppendResult) -> dict[str, Any]:
    """A command's answer: what the API returns, and what an idempotent retry gets back."""
    return {"stream_id": result.stream_id, "version": result.version, "events": [event_json(e) for e in result.events]}
