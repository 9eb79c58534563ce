"""One exception root for the projections package: callers catch one type for every user error."""

from __future__ import annotations

__all__ = ["DefinitionError", "LockedError", "ProjectionError", "RecordError", "RunError"]


class ProjectionError(Exception):
    """Root of every error this package raises on purpose."""


class DefinitionError(ProjectionError):
    """A projection file is wrong (names the projection and the field)."""


class RecordError(ProjectionError):
    """Projection code raised on a record; carries where the record is in the log."""

    def __init__(self, projection: str, topic: str, partition: int, offset: int, error: str) -> None:
        super().__init__(f"projection {projection!r} failed on {topic}/{partition}@{offset}: {error}")
        self.projection = projection
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.error = error


class RunError(ProjectionError):
    """A run or rebuild could not proceed (locked, unknown projection, Spark job failed)."""


class LockedError(RunError):
    """Another process is running or rebuilding this projection."""
