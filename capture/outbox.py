"""The transactional outbox: rows of `eventstore.events` become events on `events.<stream_type>`.

The event store never writes to the log itself (no dual write): capture reads its table like any
other, and this router turns each inserted row into the event — key = stream id, value = the
event as the API shows it, timestamp = when it occurred. Pure.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from tributary.capture.envelope import Output

__all__ = ["OUTBOX_TABLE", "route_event"]

OUTBOX_TABLE = "eventstore.events"


def _ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


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
            timestamp_ms=_ms(row["occurred_at"]),
        )
    ]
