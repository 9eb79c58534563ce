"""Server-side filters of a group member on event topics (`events.<stream_type>`), KurrentDB's
subscription filters: the member gets only the events of some types, or of streams whose id starts
with a prefix. Records that do not match are passed over by the server; the member's position moves
past them all the same, so its commits cover them. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tributary.log import Record

__all__ = ["EVENT_TOPIC_PREFIX", "EventFilter"]

EVENT_TOPIC_PREFIX = "events."  # the event store's outbox topics (docs/eventstore.md, "The outbox")


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Events of `event_types` (any type when None) in streams whose id starts with `stream_prefix`
    (any stream when None)."""

    event_types: frozenset[str] | None = None
    stream_prefix: str | None = None

    @classmethod
    def for_topics(
        cls, topics: Sequence[str], event_types: Sequence[str] | None, stream_prefix: str | None
    ) -> EventFilter | None:
        """The filter a member joins with; None when it names nothing. It applies to the records of
        event topics (only events have a type and a stream); other topics' records pass as they are."""
        if event_types is None and not stream_prefix:
            return None
        return cls(None if event_types is None else frozenset(event_types), stream_prefix or None)

    def matches(self, record: Record) -> bool:
        """Whether the member gets `record`: an event (key = the stream id, value's `type`) that the
        filter selects, or any record of a topic that is not an event topic."""
        if not record.topic.startswith(EVENT_TOPIC_PREFIX):
            return True
        if self.stream_prefix is not None:
            stream = orjson.loads(record.key) if record.key else None
            if not isinstance(stream, str) or not stream.startswith(self.stream_prefix):
                return False
        if self.event_types is not None:
            value = orjson.loads(record.value) if record.value else None
            if not isinstance(value, dict) or value.get("type") not in self.event_types:
                return False
        return True

    def to_json(self) -> dict[str, Any]:
        """As `consumers.members.filter` keeps it (and `describe` shows it)."""
        return {
            "event_types": None if self.event_types is None else sorted(self.event_types),
            "stream_prefix": self.stream_prefix,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any] | None) -> EventFilter | None:
        if not doc:
            return None
        types = doc.get("event_types")
        return cls(None if types is None else frozenset(types), doc.get("stream_prefix"))
