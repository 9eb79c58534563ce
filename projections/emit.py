"""Derived streams: a projection build's emitted records, written to a topic of the log exactly once.

A build that emits (`Projection.emit`) writes its topic through the log's transactional writer
(`tributary.log.open_writer`) as a writer of its own, `projection.<name>.<build>`: on Kafka a
transactional producer (a newer process fences the older), on the local log a topic owner of that
name (its own lock and manifest beside capture's, so it runs while capture does).
Each pass commits its records in ONE log transaction with a position under that writer's name —
the source offsets the pass read up to — so records and position are durable together on both
backends. The pass then commits its table and checkpoints in the service database. If it dies
between the two commits, the next pass reads from the database's (older) checkpoints again, folds
the same records from the same stored states, and emits only for the records at or past the
position the log holds (`since`): the table is redone, the stream is not repeated.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from tributary.log import LogError, TopicConfig, open_writer, partition_for
from tributary.projections.errors import RunError

if TYPE_CHECKING:
    from tributary.log import CaptureWriter, KafkaOptions, SourceWriter
    from tributary.projections.definition import Projection
    from tributary.projections.store import BuildRow

__all__ = ["Emitter", "decode_position", "encode_position", "opened", "since", "writer_name"]

TP = tuple[str, int]
RecordIn = tuple[bytes | None, bytes | None, int, bytes | None]  # what a writer appends: key, value, timestamp, headers
_BATCH = 10_000  # records appended to a partition at a time


def writer_name(name: str, build: int) -> str:
    """The writer (and position) name of a build's stream: one per build, so a rebuild's writer
    never fences the serving build's, and a rerun of the same build fences its predecessor."""
    return f"projection.{name}.{build}"


def encode_position(ends: Mapping[TP, int]) -> str:
    """The source offsets a commit's records cover, as the position text the log keeps."""
    return orjson.dumps({f"{t}/{p}": end for (t, p), end in sorted(ends.items())}).decode()


def decode_position(text: str | None) -> dict[TP, int]:
    """`encode_position`'s inverse; nothing emitted yet for None."""
    if not text:
        return {}
    out: dict[TP, int] = {}
    for tp, end in orjson.loads(text).items():
        topic, _, part = tp.rpartition("/")
        out[(topic, int(part))] = int(end)
    return out


def since(checkpoints: Mapping[TP, int], emitted: Mapping[TP, int]) -> dict[TP, int]:
    """Per topic-partition, the first offset whose records emit: past the database's checkpoint
    and past what the log says was emitted already (a pass that committed to the log and died
    before its database commit)."""
    return {tp: max(checkpoints.get(tp, 0), emitted.get(tp, 0)) for tp in {*checkpoints, *emitted}}


class Emitter:
    """One build's writer of its derived stream (see the module's doc)."""

    def __init__(self, log: CaptureWriter, name: str, topic: str, partitions: int) -> None:
        self.log = log
        self.name = name
        self.topic = topic
        self.partitions = partitions
        self.source: SourceWriter = log.source(name)

    def emitted(self) -> dict[TP, int]:
        """The source offsets up to which the log holds this build's records."""
        return decode_position(self.source.positions().get(self.name))

    def write(self, records: Iterable[tuple[str, str | None, int]], ends: Mapping[TP, int]) -> int:
        """Append `records` ((key JSON, value JSON or None, timestamp), in order) to the topic, each
        to its key's partition (Kafka's partitioner), and commit them with the position `ends`:
        all or nothing. Returns the records written."""
        n = 0
        try:
            config = self.source.create_topic(self.topic, TopicConfig(partitions=self.partitions, policy="none"))
            pending: dict[int, list[RecordIn]] = {}
            for key, value, ts in records:
                k = key.encode()
                batch = pending.setdefault(partition_for(k, config.partitions), [])
                batch.append((k, None if value is None else value.encode(), ts, None))
                n += 1
                if len(batch) >= _BATCH:
                    self._flush(pending)
            self._flush(pending)
            self.source.commit(positions={self.name: encode_position(ends)})
        except LogError as exc:
            raise RunError(f"writing the stream {self.topic!r} ({self.name}) to the log: {exc}") from exc
        return n

    def _flush(self, pending: dict[int, list[RecordIn]]) -> None:
        """Append what is pending, partition by partition (each partition keeps its order)."""
        for part, batch in sorted(pending.items()):
            if batch:
                self.source.append(self.topic, part, batch)
        pending.clear()


@contextmanager
def opened(root: Path, kafka: KafkaOptions | None, p: Projection, b: BuildRow) -> Iterator[Emitter | None]:
    """The build's `Emitter` for the length of a pass (None for a projection that does not emit)."""
    if p.emit is None:
        yield None
        return
    name = writer_name(p.name, b.build)
    try:
        log = open_writer(root=root, kafka=kafka, sources=[name], default_partitions=p.emit.partitions, owner=name)
    except LogError as exc:
        raise RunError(f"projection {p.name!r} cannot write its stream to the log: {exc}") from exc
    try:
        yield Emitter(log, name, p.emit.topic_for(b.version, b.build), p.emit.partitions)
    finally:
        log.close()
