"""The transactional outbox: rows of `eventstore.events` become events on `events.<stream_type>`.

The event store never writes to the log itself (no dual write): capture reads its table like any
other, and this router turns each inserted row into the event — key = stream id, value = the
event as the API shows it, timestamp = when it occurred, headers = the event id, its correlation and
causation ids and its user headers (from its metadata). Pure.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from tributary.capture.records.envelope import Output
from tributary.jsonvalue import JsonValue

__all__ = [
    "HEADER_IDS",
    "OUTBOX_TABLE",
    "STREAM_DELETED",
    "STREAM_DELETED_PREFIX",
    "event_headers",
    "route_event",
    "route_stream_deleted",
]

OUTBOX_TABLE = "eventstore.events"
# The event store's delete tells capture with a transactional logical message of this prefix
# (its content: {"stream", "stream_type", "hard", "version"}); `tributary.eventstore.store` sends it.
STREAM_DELETED_PREFIX = "tributary.eventstore.stream_deleted"
STREAM_DELETED = "$stream_deleted"  # the `type` of the delete marker record
HEADER_IDS = ("command_id", "correlation_id", "causation_id")  # metadata ids that become log headers


def _ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def event_headers(metadata: JsonValue | orjson.Fragment, event_id: str | None = None) -> bytes | None:
    """The log record's headers from an event's metadata (a dict, or capture's raw jsonb): a JSON
    object of strings, the `event_id` (the key a consumer drops a redelivered record by), the ids of
    `HEADER_IDS` and the user headers (`metadata["headers"]`, whose names never shadow the ids);
    None when there are none."""
    if isinstance(metadata, orjson.Fragment):
        raw = orjson.dumps(metadata)
        metadata = None if raw == b"{}" else orjson.loads(raw)
    headers: dict[str, str] = {}
    if isinstance(metadata, dict):
        user = metadata.get("headers")
        if isinstance(user, dict):
            headers.update((k, v) for k, v in user.items() if isinstance(v, str))
        for name in HEADER_IDS:
            value = metadata.get(name)
            if isinstance(value, str):
                headers[name] = value
    if event_id is not None:
        headers["event_id"] = event_id  # after the user headers: never shadowed
    return orjson.dumps(headers) if headers else None


def route_event(row: dict[str, Any]) -> list[Output]:
    """One `eventstore.events` row (as converted by capture.values) → one record."""
    value = {
        "id": row["event_id"],
        "stream": row["stream_id"],
        "stream_type": row["stream_type"],
        "version": row["version"],
        "position": row["global_position"],
        "type": row["type"],
        "schema_version": row["schema_version"],
        "data": row["data"],
        "metadata": row["metadata"],
        "occurred_at": row["occurred_at"],
        "recorded_at": row["recorded_at"],
    }
    return [
        Output(
            f"events.{row['stream_type']}",
            orjson.dumps(row["stream_id"]),
            orjson.dumps(value),
            headers=event_headers(row["metadata"], str(row["event_id"])),
            timestamp_ms=_ms(row["occurred_at"]),
        )
    ]


def route_stream_deleted(content: str) -> list[Output]:
    """A stream's delete (the logical message's content) → two records on `events.<stream_type>`,
    keyed by the stream id: the delete marker (value `{"type": "$stream_deleted", "stream",
    "stream_type", "hard", "version", "occurred_at"}`: a consumer drops what it holds of the
    stream), then the key's tombstone (compaction of an events topic removes the stream's records
    through it). None for a stream whose type is unknown (nothing of it was ever stored)."""
    doc = orjson.loads(content)
    stream_type = doc.get("stream_type")
    if not isinstance(stream_type, str):
        return []
    key = orjson.dumps(doc["stream"])
    marker = {
        "type": STREAM_DELETED,
        "stream": doc["stream"],
        "stream_type": stream_type,
        "hard": bool(doc.get("hard")),
        "version": doc.get("version"),
        "occurred_at": doc.get("occurred_at"),
    }
    topic = f"events.{stream_type}"
    at = doc.get("occurred_at")
    ts = _ms(at) if isinstance(at, str) else None
    return [Output(topic, key, orjson.dumps(marker), timestamp_ms=ts), Output(topic, key, None, timestamp_ms=ts)]
