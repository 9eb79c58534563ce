"""The log's exception root and its specific failures (one class per thing a caller may handle)."""

from __future__ import annotations

__all__ = [
    "CorruptRecordError",
    "DiskFullError",
    "LogError",
    "LogLockedError",
    "MissingMetadataError",
    "TopicNotFoundError",
    "TopicOwnedError",
    "WriterFenced",
]


class LogError(Exception):
    """Root of every error raised by `tributary.log.local`."""


class LogLockedError(LogError):
    """Another process holds the writer lock on this log root."""


class WriterFenced(LogError):
    """A newer writer with this writer's identity took over (Kafka: a producer with the same
    transactional id): nothing of this writer's open commit is seen; a new writer may go on."""


class MissingMetadataError(LogError):
    """Segment files that the manifest does not list: not an empty log; `log verify --repair`
    rebuilds the manifest. Readers that treat a missing log as "nothing captured yet" must not
    treat this one so."""


class TopicNotFoundError(LogError):
    """The topic is not in the manifest."""


class TopicOwnedError(LogError):
    """The topic is another owner's (owners.py): this writer may not create or write it."""

    def __init__(self, message: str, *, topic: str, holder: str) -> None:
        super().__init__(message)
        self.topic = topic
        self.holder = holder  # the owner's name, "" for the default owner (capture)


class DiskFullError(LogError):
    """ENOSPC while writing: nothing new was committed; the committed state is intact."""


class CorruptRecordError(LogError):
    """A record inside committed data is damaged (bad CRC, undecodable, out of order)."""

    def __init__(self, message: str, *, topic: str, partition: int, segment: str, offset: int | None) -> None:
        where = f"{topic}/{partition} segment {segment}"
        at = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"corrupt record in {where}{at}: {message}")
        self.topic = topic
        self.partition = partition
        self.segment = segment
        self.offset = offset
        self.detail = message
