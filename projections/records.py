"""The record a projection sees, decoded from a log record, and its sort key.

A fold never reorders a key's records within one topic-partition (log order is commit order:
a snapshot read's `ts_ms` is when the snapshot ran, later than a change streamed just after the
snapshot point, and producers' clocks disagree). Event time only picks which topic-partition's
head goes next when a key's records come from several, earliest first with the total tie-break
(topic, partition, offset): `engine.fold_order` merges them by `sort_key`'s fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import orjson

from tributary.jsonvalue import JsonValue

__all__ = [
    "SCHEMA_KEY",
    "ProjectionRecord",
    "SortKey",
    "decode",
    "default_event_time",
    "iso_to_ms",
    "ms_to_iso",
    "sort_key",
]

SortKey = tuple[int, str, int, int]
# The log key of a CDC topic's schema records (capture writes it canonical: docs/envelope.md).
SCHEMA_KEY = '{"__schema__":true}'
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class ProjectionRecord:
    """A log record with its key/value/headers decoded from JSON (value None = tombstone)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: JsonValue
    value: JsonValue
    headers: JsonValue
    event_time: int
    joined: Mapping[str, JsonValue] | None = None  # the projection's tables' rows as of this record

    def lookup(self, table: str) -> JsonValue:
        """The row of the projection's table `table` (`Projection.tables`) this record joins, as of
        its place in the merge order: None when the table has no row for its key then."""
        if self.joined is None or table not in self.joined:
            raise KeyError(f"{table!r} is not among the projection's tables (Projection.tables)")
        return self.joined[table]

    @property
    def is_event(self) -> bool:
        return self.topic.startswith("events.")

    @property
    def is_schema(self) -> bool:
        """A schema record (key `{"__schema__": true}`): the table's columns and types, not a row.
        Only projections declared with `schema_records=True` receive them."""
        return isinstance(self.key, dict) and self.key.get("__schema__") is True and not self.is_event

    @property
    def is_truncate(self) -> bool:
        """A CDC truncate: `op: "t"` with no key, one copy on every partition of the table's topic."""
        return self.key is None and not self.is_event and isinstance(self.value, dict) and self.value.get("op") == "t"

    @property
    def type(self) -> str | None:
        """The event type (`events.*` topics) or the CDC op (`c|u|d|r|t`); None for a tombstone."""
        if not isinstance(self.value, dict):
            return None
        return self.value.get("type") if self.is_event else self.value.get("op")

    @property
    def data(self) -> JsonValue:
        """The event's `data` (events) — a shortcut folds use constantly."""
        return self.value.get("data") if isinstance(self.value, dict) else None


def iso_to_ms(text: str) -> int:
    """ISO-8601 → epoch ms, exactly (no float); a zone-less time is taken as UTC."""
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - _EPOCH) // _MS


def ms_to_iso(ms: int) -> str:
    """Epoch ms → ISO-8601 in UTC with milliseconds (what window bounds are written as)."""
    return (_EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")


def default_event_time(topic: str, value: JsonValue, timestamp: int) -> int:
    """The event's `occurred_at`; a CDC envelope's `source.ts_ms` (commit time); else log time."""
    if isinstance(value, dict):
        if topic.startswith("events."):
            occurred = value.get("occurred_at")
            if isinstance(occurred, str):
                return iso_to_ms(occurred)
        else:
            source = value.get("source")
            if isinstance(source, dict) and isinstance(source.get("ts_ms"), int):
                return int(source["ts_ms"])
            if isinstance(value.get("ts_ms"), int):
                return int(value["ts_ms"])
    return timestamp


def _loads(raw: bytes | str | None) -> JsonValue:
    return None if raw is None else orjson.loads(raw)


def decode(
    topic: str,
    partition: int,
    offset: int,
    timestamp: int,
    key: bytes | str | None,
    value: bytes | str | None,
    headers: bytes | str | None,
) -> ProjectionRecord:
    """Decode one log record's JSON fields and give it its default event time."""
    v = _loads(value)
    return ProjectionRecord(
        topic,
        partition,
        offset,
        timestamp,
        _loads(key),
        v,
        _loads(headers),
        default_event_time(topic, v, timestamp),
    )


def sort_key(record: ProjectionRecord) -> SortKey:
    """(event time, topic, partition, offset): how two topic-partitions' heads compare (earliest
    first, then a total tie-break); within one topic-partition, offsets alone order records."""
    return (record.event_time, record.topic, record.partition, record.offset)
