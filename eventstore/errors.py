"""Event store errors: one root; each carries what a caller needs to act (and the API maps them)."""

from __future__ import annotations

from typing import Any

__all__ = [
    "AggregateDefinitionError",
    "CommandRejected",
    "ConcurrencyConflict",
    "EventStoreError",
    "HistoryHidden",
    "IdempotencyMismatch",
    "InvalidCommand",
    "InvalidValue",
    "MetadataConflict",
    "PartialDuplicateBatch",
    "StreamDeleted",
    "StreamNotFound",
    "StoreUnavailable",
    "UnknownCommand",
    "UnknownPosition",
    "UnknownStreamType",
]


class EventStoreError(Exception):
    """Root of event store errors."""


class AggregateDefinitionError(EventStoreError):
    """A domain module or `Aggregate` breaks a rule of the file API (the message names the file and the rule)."""


class ConcurrencyConflict(EventStoreError):
    """The stream is not at the version the append expected; `attempts` > 1 when the handler retried
    (with backoff) and every attempt lost to another writer."""

    def __init__(self, stream_id: str, expected: object, actual: int, *, attempts: int = 1) -> None:
        if attempts > 1:
            what = f"other writers changed stream {stream_id!r} during each of {attempts} attempts (now at version {actual})"
            hint = "retry the command"
        else:
            what = f"stream {stream_id!r} is at version {actual}, expected {expected}"
            hint = "read the stream again and retry (with expected_version set to the version you read)"
        super().__init__(f"{what}; {hint}")
        self.stream_id, self.expected, self.actual, self.attempts = stream_id, expected, actual, attempts


class CommandRejected(EventStoreError):
    """The aggregate's rules refuse the command (`rule` names which one)."""

    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(f"{rule}: {reason}")
        self.rule, self.reason = rule, reason


class InvalidCommand(EventStoreError):
    """The command's data does not fit its schema; `errors` says which field and why."""

    def __init__(self, command: str, errors: list[dict[str, Any]]) -> None:
        first = errors[0] if errors else {"loc": (), "msg": "invalid"}
        field = ".".join(str(p) for p in first.get("loc", ())) or "(body)"
        super().__init__(f"{command}: {field}: {first.get('msg')}")
        self.command, self.errors = command, errors


class InvalidValue(EventStoreError):
    """A stream id, command id or data value the store cannot hold (too long, a NUL character, an
    unpaired UTF-16 surrogate, an integer beyond 64 bits); `field` names where it was."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem


class StoreUnavailable(EventStoreError):
    """The service database did not answer (refused, lost or pool exhausted): retrying may succeed."""


class UnknownStreamType(EventStoreError):
    """No aggregate is registered for this stream type."""


class UnknownCommand(EventStoreError):
    """The aggregate has no command of this type."""


class IdempotencyMismatch(EventStoreError):
    """A command id was reused with a different command."""


class PartialDuplicateBatch(EventStoreError):
    """Some, not all, of a batch's event ids are already stored: refuse rather than guess."""


class UnknownPosition(EventStoreError):
    """A position to read after that names no stored event (positions come from events read)."""

    def __init__(self, position: int) -> None:
        super().__init__(
            f"no event at position {position}; continue from the position of an event you read (0: the start)"
        )
        self.position = position


class StreamDeleted(EventStoreError):
    """The stream was deleted for good (a tombstone, a hard delete): its id is never used again."""

    def __init__(self, stream_id: str) -> None:
        super().__init__(f"stream {stream_id!r} was deleted for good (hard delete); use another stream id")
        self.stream_id = stream_id


class StreamNotFound(EventStoreError):
    """The stream has no events to act on (never written, or deleted)."""

    def __init__(self, stream_id: str) -> None:
        super().__init__(f"no stream {stream_id!r}")
        self.stream_id = stream_id


class MetadataConflict(EventStoreError):
    """The stream's metadata is not at the version the write expected."""

    def __init__(self, stream_id: str, expected: object, actual: int) -> None:
        super().__init__(
            f"the metadata of stream {stream_id!r} is at version {actual}, expected {expected}; "
            "read it again and retry (with expected_metadata_version set to the version you read)"
        )
        self.stream_id, self.expected, self.actual = stream_id, expected, actual


class HistoryHidden(EventStoreError):
    """A command's load found early events hidden by the stream's metadata (or removed by a
    scavenge) and no snapshot covering them: folding the rest would give a wrong state."""

    def __init__(self, stream_id: str, missing_from: int, visible_from: int | None) -> None:
        shown = f"its events start at version {visible_from}" if visible_from else "none of its events are visible"
        super().__init__(
            f"stream {stream_id!r}: {shown}, and no snapshot covers the versions from {missing_from}; "
            "set its limits only where snapshots are taken (snapshot_every), or raise them"
        )
        self.stream_id, self.missing_from, self.visible_from = stream_id, missing_from, visible_from
