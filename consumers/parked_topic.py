"""A group's parked records in a topic of the log, `<group>.parked`: the original record (key, value,
headers) with headers saying where it came from and why it was set aside, as Kafka's dead-letter
topics do (Kafka Connect's `__connect.errors.*`, Spring's `kafka_dlt-*` headers).

The topic is written before the park commits in the service database (docs/consumers.md, "Saying
no"): a park that did not commit leaves a record whose `tributary.parked.id` the database does not
know, and the listing shows only parks the database committed. Local log: the writer owner `groups`,
shared by every server process, each taking the owner's lock for one park (a bounded wait); Kafka: a
transactional producer per process (`groups.<host>.<pid>`), kept between parks, so server processes
never fence each other.

A group may not park where another writer writes: a parked topic in capture's namespace (a source's
`<source>.`, the event store's `events.`) or one another owner committed is refused at join
(`check_name`), and a park that meets one later gets the same answer (`ParkedTopicTaken`).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from tributary.consumers.errors import ParkedTopicTaken
from tributary.log import (
    LogError,
    Record,
    TopicConfig,
    TopicOwnedError,
    WriterFenced,
    describe_owner,
    open_writer,
)

if TYPE_CHECKING:
    from tributary.log import CaptureWriter, KafkaOptions, LogReader

__all__ = [
    "EVENTS",
    "LOCK_TIMEOUT_S",
    "OWNER",
    "PREFIX",
    "Park",
    "ParkedTopic",
    "capture_namespace",
    "check_name",
    "headers_for",
    "parked_topic",
    "read_park",
]

OWNER = "groups"  # the local log's writer owner of every group's parked topic
PREFIX = "tributary.parked."  # the headers a parked record carries beside its own
LOCK_TIMEOUT_S = 10.0  # how long a park waits for another server process's park
EVENTS = "events"  # the event store's topics, `events.<stream_type>`, which capture writes
_TOPIC_SAFE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def parked_topic(group: str) -> str:
    """The group's parked topic: `<group>.parked` where the group's name is a valid topic name;
    else its other characters become `_` and a hash of the name keeps it apart from any other
    (`a:b` → `a_b-<8 hex>.parked`)."""
    if _TOPIC_SAFE.match(group):
        return f"{group}.parked"
    safe = _UNSAFE.sub("_", group)
    if not safe[0].isalnum() and safe[0] != "_":
        safe = "_" + safe[1:]
    return f"{safe}-{hashlib.sha256(group.encode()).hexdigest()[:8]}.parked"


def capture_namespace(topic: str, capture_sources: Sequence[str]) -> str | None:
    """Capture as the writer of `topic` when the name is in its namespace: a source's topics
    (`<source>.…`: a source's name has no '.') and the event store's (`events.…`); else None."""
    head, dot, _ = topic.partition(".")
    if not dot:
        return None
    if head == EVENTS or head in capture_sources:
        return f"capture (every topic named '{head}.*')"
    return None


def _taken(group: str, topic: str, whose: str) -> ParkedTopicTaken:
    return ParkedTopicTaken(
        f"group {group!r} would park records to topic {topic!r}, which is written by {whose}: give the group another name"
    )


def check_name(group: str, view: LogReader, capture_sources: Sequence[str]) -> None:
    """ParkedTopicTaken unless the group's parked topic is free for it: not in capture's namespace
    (the configured `capture_sources`, the event store), not a topic another owner committed."""
    topic = parked_topic(group)
    whose = capture_namespace(topic, capture_sources)
    if whose is not None:
        raise _taken(group, topic, whose)
    owner = view.topic_owner(topic)
    if owner is not None and owner != OWNER:
        raise _taken(group, topic, describe_owner(owner))


@dataclass(frozen=True, slots=True)
class Park:
    """One park as its topic holds it: the original record and why it was set aside."""

    record: Record
    park_id: str
    reason: str
    attempts: int
    parked_at: datetime
    parked_by: str | None


def headers_for(p: Park) -> bytes:
    """The parked record's headers: the original's (a JSON object) plus `tributary.parked.*`; an
    original that was not a plain object of strings (or used the prefix) travels whole."""
    own: dict[str, str] = {}
    whole = None
    if p.record.headers is not None:
        parsed = orjson.loads(p.record.headers)
        if isinstance(parsed, dict) and all(isinstance(v, str) and not k.startswith(PREFIX) for k, v in parsed.items()):
            own = parsed
        else:
            whole = p.record.headers.decode()
    r = p.record
    ours = {
        "topic": r.topic,
        "partition": str(r.partition),
        "offset": str(r.offset),
        "timestamp": str(r.timestamp),
        "reason": p.reason,
        "attempts": str(p.attempts),
        "parked_at": p.parked_at.isoformat(),
        "id": p.park_id,
        **({"parked_by": p.parked_by} if p.parked_by is not None else {}),
        **({"headers": whole} if whole is not None else {}),
    }
    return orjson.dumps({**own, **{PREFIX + k: v for k, v in ours.items()}})


def read_park(rec: Record) -> Park | None:
    """A record of a parked topic back as its park (None: not one tributary wrote)."""
    try:
        h = orjson.loads(rec.headers) if rec.headers is not None else None
    except orjson.JSONDecodeError:
        return None
    if not isinstance(h, dict) or not isinstance(h.get(PREFIX + "id"), str):
        return None
    own = {k: v for k, v in h.items() if not k.startswith(PREFIX)}
    whole = h.get(PREFIX + "headers")
    headers = whole.encode() if isinstance(whole, str) else (orjson.dumps(own) if own else None)
    original = Record(
        h[PREFIX + "topic"],
        int(h[PREFIX + "partition"]),
        int(h[PREFIX + "offset"]),
        int(h[PREFIX + "timestamp"]),
        rec.key,
        rec.value,
        headers,
    )
    return Park(
        original,
        h[PREFIX + "id"],
        h[PREFIX + "reason"],
        int(h[PREFIX + "attempts"]),
        datetime.fromisoformat(h[PREFIX + "parked_at"]),
        h.get(PREFIX + "parked_by"),
    )


class ParkedTopic:
    """Appends parks to their group's topic, one durable commit per call (thread-safe: this
    process's parks take turns, as other processes' do through the owner's lock).

    The local log's writer is opened per park (the owner's lock is taken in turns by every server
    process). Kafka's is kept: one transactional producer per process, initialised by the first
    park (`init_transactions` costs round trips to the transaction coordinator), dropped after a
    failed park, replaced at once when it was fenced, let go by `close`."""

    def __init__(self, root: Path, kafka: KafkaOptions | None) -> None:
        self.root = root
        self.kafka = kafka
        self.name = f"{OWNER}.{socket.gethostname()}.{os.getpid()}"  # the Kafka producer's own id
        self._turn = threading.Lock()
        self._kept: CaptureWriter | None = None  # Kafka's producer, between parks
        self.writers_opened = 0  # writers opened for parks: on Kafka, producers initialised

    def append(self, group: str, parks: Sequence[Park]) -> None:
        """Write `parks` to the group's parked topic, durable and visible on return; a LogError
        (the owner's lock not let go in time, the log unwritable) says why not, ParkedTopicTaken
        that another owner took the topic."""
        if not parks:
            return
        topic = parked_topic(group)
        with self._turn:
            try:
                if self.kafka is None:
                    log = self._open()
                    try:
                        self._write(log, topic, parks)
                    finally:
                        log.close()
                    return
                try:
                    self._write(self._producer(), topic, parks)
                except WriterFenced:  # a producer with this id took over: nothing of it was seen
                    self._drop()
                    self._write(self._producer(), topic, parks)
                self._producer().await_visible()  # the brokers write its markers after the commit
            except TopicOwnedError as exc:
                raise _taken(group, topic, describe_owner(exc.holder)) from None
            except LogError:
                self._drop()  # its transaction failed: the next park starts from a new producer
                raise

    def close(self) -> None:
        """Let Kafka's producer go (at shutdown; a later park would start a new one)."""
        with self._turn:
            self._drop()

    def _open(self) -> CaptureWriter:
        log = open_writer(
            root=self.root,
            kafka=self.kafka,
            sources=[self.name],
            default_partitions=1,
            owner=OWNER,
            lock_timeout_s=LOCK_TIMEOUT_S,
        )
        self.writers_opened += 1
        return log

    def _producer(self) -> CaptureWriter:
        if self._kept is None:
            self._kept = self._open()
        return self._kept

    def _drop(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None:
            kept.close()  # drops what its failed commit still held

    def _write(self, log: CaptureWriter, topic: str, parks: Sequence[Park]) -> None:
        src = log.source(self.name)
        src.create_topic(topic, TopicConfig(partitions=1))
        src.append(topic, 0, [(p.record.key, p.record.value, p.record.timestamp, headers_for(p)) for p in parks])
        log.commit()
