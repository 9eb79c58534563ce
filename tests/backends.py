"""The log backends, as the contract suite (tests/integration/contract/) drives them: one test runs
on each backend through the `backend` fixture, `-k local` / `-k kafka` selects one.

A `LogBackend` knows how to point capture (and the CLI, the HTTP API, sinks, projections) at its
log with a `[log]` TOML table, how to read back what a read_committed consumer sees of a topic, and
how to open the product's own writer and admin on it (`tributary.log.open_writer` / `open_admin`).
A third backend joins the suite with a class here and an entry in `BACKENDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import orjson
import pytest

from tests.kafka_fixtures import KafkaCluster
from tributary.log import CaptureWriter, KafkaOptions, LogAdmin, Record, open_admin, open_writer

__all__ = [
    "BACKENDS",
    "KafkaBackend",
    "LocalBackend",
    "LogBackend",
    "admin",
    "backend",
    "changes",
    "table_state",
    "write_backend_config",
    "writer",
]


class LogBackend(Protocol):
    """What a contract test asks of a log backend."""

    name: str
    commit_takes_an_offset: bool  # a transaction's commit marker takes an offset (Kafka)
    topic_policy: str  # how `log topics` shows the policy of a topic capture made

    def log_toml(self, log_root: Path, *, writer_id: str | None = None) -> str:
        """The `[log]` table (and its sub-tables) that points a config at this backend: `log_root`
        holds the local log, or only capture's status file where the log lives elsewhere.
        `writer_id` names the writer where the backend fences by name (Kafka's transactional id)."""
        ...

    def kafka_options(self, writer_id: str = "contract") -> KafkaOptions | None:
        """The `[log.kafka]` options, None where the log is not on Kafka (for `open_writer` / `open_admin`)."""
        ...

    def prepare(self, *topics: str) -> None:
        """Make `topics` as an operator would where capture may not make them itself."""
        ...

    def records(self, log_root: Path, topic: str) -> list[Record]:
        """Every committed record of `topic` (none for an unknown topic), each partition in offset order."""
        ...

    def committed(self, dsn: str, log_root: Path, group: str, topic: str, partitions: int = 3) -> dict[int, int]:
        """A consumer group's committed offsets, read where the backend keeps them."""
        ...


def writer(backend: LogBackend, log_root: Path, sources: list[str], writer_id: str = "contract") -> CaptureWriter:
    """The product's capture writer on `backend` (the local log under `log_root`)."""
    return open_writer(root=log_root, kafka=backend.kafka_options(writer_id), sources=sources, default_partitions=3)


def admin(backend: LogBackend, log_root: Path) -> LogAdmin:
    """The product's operator view of `backend`."""
    return open_admin(root=log_root, kafka=backend.kafka_options())


class LocalBackend:
    """Tributary's own segment log under the config's `[log] root`."""

    name = "local"
    commit_takes_an_offset = False
    topic_policy = "compact"

    def log_toml(self, log_root: Path, *, writer_id: str | None = None) -> str:
        """`[log]` with the local log under `log_root` (a root has one writer: no id)."""
        return f'[log]\nroot = "{log_root}"\npartitions = 3\nlinger_ms = 2\n'

    def kafka_options(self, writer_id: str = "contract") -> KafkaOptions | None:
        """None: the local log."""
        return None

    def prepare(self, *topics: str) -> None:
        """Nothing: capture makes its topics."""

    def records(self, log_root: Path, topic: str) -> list[Record]:
        """Read through the local log's own reader, committed records only."""
        from tributary.log.local import Log

        if not log_root.exists():
            return []
        with Log.open(log_root) as log:
            if topic not in log.topics():
                return []
            return [r for p in range(log.topics()[topic].partitions) for r in log.read(topic, p)]

    def committed(self, dsn: str, log_root: Path, group: str, topic: str, partitions: int = 3) -> dict[int, int]:
        """The group's offsets in Postgres (`consumers.offsets`, where the coordinator commits them)."""
        import psycopg

        with psycopg.connect(dsn) as conn:
            rows = conn.execute(
                "SELECT partition, committed_offset FROM consumers.offsets WHERE group_id = %s AND topic = %s",
                (group, topic),
            ).fetchall()
        return {int(p): int(o) for p, o in rows if int(p) < partitions}


class KafkaBackend:
    """A Kafka cluster (the session's real broker): capture makes its topics there, the config's
    `[log] root` keeps only capture's status file."""

    name = "kafka"
    commit_takes_an_offset = True
    topic_policy = "broker"

    def __init__(self, cluster: KafkaCluster) -> None:
        self.cluster = cluster

    def log_toml(self, log_root: Path, *, writer_id: str | None = None) -> str:
        """`[log]` on Kafka; the transactional id derives from `log_root` unless `writer_id` names it."""
        tid = writer_id or f"capture-{abs(hash(str(log_root))) % 100000}"
        options = self.cluster.options(tid)
        return (
            f'[log]\nbackend = "kafka"\nroot = "{log_root}"\npartitions = 3\nlinger_ms = 2\n\n'
            f'[log.kafka]\nbootstrap_servers = "{options.bootstrap_servers}"\npartitions = 3\n'
            f"replication_factor = {options.replication_factor}\n"
            f"create_topics = {'true' if options.create_topics else 'false'}\n"
            f'transactional_id = "{tid}"\nclient = {{ "log_level" = "3" }}\n'
        )

    def kafka_options(self, writer_id: str = "contract") -> KafkaOptions | None:
        """The cluster's options, `writer_id` as the transactional id."""
        return self.cluster.options(writer_id)

    def prepare(self, *topics: str) -> None:
        """The cluster's operator step (only the mock needs one)."""
        self.cluster.prepare(*topics)

    def records(self, log_root: Path, topic: str) -> list[Record]:
        """Read through the Kafka backend's own read_committed reader."""
        from tributary.log.kafka.read import kafka_records
        from tributary.log.local import TopicNotFoundError

        try:
            return list(kafka_records(self.cluster.options("reader"), topic))
        except TopicNotFoundError:
            return []

    def committed(self, dsn: str, log_root: Path, group: str, topic: str, partitions: int = 3) -> dict[int, int]:
        """What any Kafka client sees as the group's committed offsets (Kafka's own group offsets)."""
        from confluent_kafka import Consumer, TopicPartition

        from tributary.log.kafka.clients import with_logger

        consumer = Consumer(
            with_logger({"bootstrap.servers": self.cluster.bootstraps, "group.id": group, "enable.auto.commit": False})
        )
        try:
            got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
            return {tp.partition: tp.offset for tp in got if tp.offset >= 0}
        finally:
            consumer.close()


def _local(request: pytest.FixtureRequest) -> LogBackend:
    """The local log: nothing to start, each test has its own root."""
    return LocalBackend()


def _kafka(request: pytest.FixtureRequest) -> LogBackend:
    """The session's real broker, emptied of earlier tests' topics (`kafka_broker`)."""
    return KafkaBackend(request.getfixturevalue("kafka_broker"))


BACKENDS: dict[str, Callable[[pytest.FixtureRequest], LogBackend]] = {"local": _local, "kafka": _kafka}
"""Each backend the suite runs on, by the name its tests carry (`test_x[local]`), with how a test gets it."""


@pytest.fixture(params=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> LogBackend:
    """Each contract test once per backend of `BACKENDS`."""
    return BACKENDS[request.param](request)


def table_state(records: list[Record]) -> dict[str, dict[str, Any]]:
    """Fold a CDC topic's records into {canonical key: row}, what a consumer would rebuild."""
    state: dict[str, dict[str, Any]] = {}
    for rec in records:
        if rec.value is None or rec.key is None:
            continue
        value = orjson.loads(rec.value)
        if "op" not in value:
            continue  # a schema record
        key = rec.key.decode()
        if value["op"] in ("c", "r", "u"):
            state[key] = value["after"]
        elif value["op"] == "d":
            state.pop(key, None)
    return state


def changes(records: list[Record]) -> list[dict[str, Any]]:
    """The change events among `records` (schema records and tombstones left out)."""
    return [v for v in (orjson.loads(r.value) for r in records if r.value) if "op" in v]


def write_backend_config(
    backend: LogBackend,
    path: Path,
    *,
    dsn: str,
    log_root: Path,
    name: str = "shop",
    writer_id: str | None = None,
    extra: str = "",
    source_extra: str = "",
) -> Path:
    """A capture config of one source (tests/integration/capture/helpers.py `write_config`) on `backend`."""
    from tests.integration.capture.helpers import write_config

    log = backend.log_toml(log_root, writer_id=writer_id)
    return write_config(path, dsn=dsn, log_root=log_root, name=name, extra=extra, source_extra=source_extra, log=log)
