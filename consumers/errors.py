"""The consumers package's errors: one root, one subclass per answer a caller may act on."""

from __future__ import annotations

__all__ = [
    "ConsumerError",
    "Fenced",
    "GroupBusy",
    "NotAssigned",
    "NotFound",
    "OffsetOutOfRange",
    "ParkedTopicTaken",
    "UnknownMember",
]


class ConsumerError(Exception):
    """Every failure of a consumer-group operation (the CLI prints it as one line)."""


class UnknownMember(ConsumerError):
    """The member left, or missed its heartbeats for its session timeout: join again."""

    code = "unknown_member"

    def __init__(self, message: str, *, generation: int) -> None:
        super().__init__(message)
        self.generation = generation


class Fenced(ConsumerError):
    """The caller's generation is not the group's: a rebalance happened; heartbeat or join again."""

    code = "fenced"

    def __init__(self, message: str, *, generation: int) -> None:
        super().__init__(message)
        self.generation = generation


class NotAssigned(ConsumerError):
    """A commit names a partition the member does not hold in this generation."""

    code = "not_assigned"

    def __init__(self, message: str, *, generation: int) -> None:
        super().__init__(message)
        self.generation = generation


class OffsetOutOfRange(ConsumerError):
    """A position fell behind the log's retention and the member's `auto_offset_reset` is `error`."""

    code = "offset_out_of_range"

    def __init__(self, message: str, *, topic: str, partition: int, position: int, start: int) -> None:
        super().__init__(message)
        self.topic, self.partition, self.position, self.start = topic, partition, position, start


class GroupBusy(ConsumerError):
    """A reset of a group that still has live members (Kafka refuses it too)."""

    code = "group_not_empty"


class ParkedTopicTaken(ConsumerError):
    """The group's parked topic is a name another writer has or will have (capture's namespace, a
    topic another owner wrote): the group needs another name."""

    code = "parked_topic_taken"


class NotFound(ConsumerError):
    """A topic the log does not hold, or a group with nothing to reset."""

    code = "not_found"
