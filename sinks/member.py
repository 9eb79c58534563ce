"""A sink's membership in its consumer group, in-process: the group coordinator
(`tributary.consumers.GroupCoordinator`) on the service database and the log's files, no HTTP hop.

It has the shape of `tributary_client.Consumer` (`poll`, `commit`, `close`), so the sink's loop is
the same whichever way it reads. A heartbeat thread keeps the membership while a batch is being
retried; a rebalance (a fenced fetch or commit, an unknown member, a heartbeat that says so) makes
the next poll join again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

import orjson
import psycopg
from psycopg_pool import PoolTimeout
from tributary_client import (
    CommitFailedError,
    ConsumerError,
    OffsetOutOfRangeError,
    OffsetReset,
    Record,
    TopicPartition,
)

from tributary.consumers import ConsumerError as GroupError
from tributary.consumers import Fenced, GroupCoordinator, NotAssigned, OffsetOutOfRange, UnknownMember
from tributary.log import LogError
from tributary.log import Record as LogRecord

__all__ = ["GroupMember", "to_record"]


def to_record(record: LogRecord) -> Record:
    """A log record as consumers see it: key as text, value decoded, headers as text."""
    headers: dict[str, str] = {}
    if record.headers:
        raw = orjson.loads(record.headers)
        if isinstance(raw, dict):
            headers = {str(k): v if isinstance(v, str) else orjson.dumps(v).decode() for k, v in raw.items()}
    return Record(
        topic=record.topic,
        partition=record.partition,
        offset=record.offset,
        timestamp_ms=record.timestamp,
        key=None if record.key is None else record.key.decode(),
        value=None if record.value is None else orjson.loads(record.value),
        headers=headers,
    )


class GroupMember:
    """A member of `group` reading `topics` through `coordinator` (not closed by this object)."""

    def __init__(
        self,
        coordinator: GroupCoordinator,
        *,
        group: str,
        topics: Sequence[str],
        auto_offset_reset: OffsetReset = "latest",
        session_timeout_ms: int | None = None,
        max_records: int = 500,
        max_bytes: int = 1_048_576,
    ) -> None:
        self.coordinator = coordinator
        self.group, self.topics = group, tuple(topics)
        self.auto_offset_reset: OffsetReset = auto_offset_reset
        self.session_timeout_ms = session_timeout_ms
        self.max_records, self.max_bytes = max_records, max_bytes
        self._lock = threading.Lock()
        self._member_id: str | None = None
        self._generation = -1
        self._heartbeat_s = 3.0
        self._rejoin = True
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @property
    def member_id(self) -> str | None:
        return self._member_id

    def poll(self, timeout_ms: int | None = None) -> list[Record]:
        """The next records of the member's partitions, waiting up to `timeout_ms` for the first."""
        deadline = time.monotonic() + (timeout_ms if timeout_ms is not None else 1000) / 1000
        while True:
            self._ensure_joined()
            try:
                batch = self.coordinator.fetch(
                    self.group, self._member(), self._generation, max_records=self.max_records, max_bytes=self.max_bytes
                )
            except (Fenced, UnknownMember):
                self._mark_rejoin()
                continue
            except OffsetOutOfRange as exc:
                raise OffsetOutOfRangeError(str(exc)) from None
            except (GroupError, LogError) as exc:  # LogError: the log (e.g. a Kafka cluster) cannot be read now
                raise ConsumerError(str(exc)) from None
            if batch.records:
                return [to_record(r) for r in batch.records]
            # Nothing new: wait until the log's committed end moves (re-reading its manifest), or time is up.
            view = self.coordinator.view
            while view.version == batch.version:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                time.sleep(min(left, self.coordinator.poll_interval_s))
                view.refresh()

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
        """Commit `offsets` (next offset per partition). CommitFailedError when the group rebalanced."""
        if not offsets:
            return {}
        chosen = dict(offsets)
        try:
            self.coordinator.commit(
                self.group, self._member(), self._generation, [(tp.topic, tp.partition, o) for tp, o in chosen.items()]
            )
        except (Fenced, UnknownMember, NotAssigned) as exc:
            self._mark_rejoin()
            raise CommitFailedError(f"commit refused, the group rebalanced: {exc}") from None
        except (GroupError, LogError) as exc:
            raise ConsumerError(str(exc)) from None
        return chosen

    def close(self) -> None:
        """Leave the group (its partitions move at once) and stop the heartbeats."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        if self._member_id is not None:
            self.coordinator.leave(self.group, self._member_id)

    def _member(self) -> str:
        assert self._member_id is not None
        return self._member_id

    def _mark_rejoin(self) -> None:
        with self._lock:
            self._rejoin = True

    def _ensure_joined(self) -> None:
        if not self._rejoin:
            return
        joined = self.coordinator.join(
            self.group,
            self.topics,
            member_id=self._member_id,
            session_timeout_ms=self.session_timeout_ms,
            auto_offset_reset=self.auto_offset_reset,
        )
        with self._lock:
            self._member_id, self._generation, self._rejoin = joined.member_id, joined.generation, False
            self._heartbeat_s = joined.heartbeat_interval_ms / 1000
        if self._beat is None:
            self._beat = threading.Thread(target=self._heartbeats, name=f"sink-heartbeat-{self.group}", daemon=True)
            self._beat.start()

    def _heartbeats(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            with self._lock:
                member, generation, rejoin = self._member_id, self._generation, self._rejoin
            if member is None or rejoin:
                continue
            try:
                beat = self.coordinator.heartbeat(self.group, member, generation)
            except UnknownMember:
                self._mark_rejoin()
                continue
            except (psycopg.OperationalError, PoolTimeout, LogError):
                continue  # the database (or the Kafka cluster) may be restarting: the next poll reports it
            if beat.rebalance:
                self._mark_rejoin()
