"""Kafka's promises, proven on Kafka. Three real brokers (3 replicas, min.insync.replicas=2) while
pgbench writes and capture is killed -9, fenced by a zombie's successor, and the cluster loses the
leader of a partition (kill -9), restarts a broker and restarts as a whole. The oracle is the
database: a read_committed consumer sees every committed change once, and the latest record per
key equals every table (test_kafka_pgbench.assert_exactly_once)."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.capture.helpers import Capture, capture_progress, cli, spawn_capture, wait_for
from tests.integration.capture.test_chunked_pgbench import _pgbench
from tests.integration.kafka.helpers import read_committed
from tests.integration.kafka.test_kafka_pgbench import (
    RATE,
    _changes,
    _kill,
    _prepare,
    _streaming,
    assert_exactly_once,
)
from tests.kafka_fixtures import KafkaCluster
from tests.waiting import size_of, wait_exit
from tributary.api.devkafka import EmbeddedKafka
from tributary.capture.status import read_status
from tributary.consumers import GroupCoordinator
from tributary.consumers.datatypes import Membership
from tributary.eventstore.migrate import run_migrations
from tributary.log.kafka.writer import KafkaLog, transactional_id

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

FENCED = "another capture process took over its Kafka producer"
RETRYING = "Kafka cannot take the commit yet"
RECOVERED = "Kafka took the commit after"


def _streams_on(status_root: Path, proc: Capture, more: int) -> None:
    """Wait until `proc` streamed `more` changes past what it had streamed now (capture goes on)."""
    start = _changes(status_root, proc.pid)
    wait_for(
        lambda: _changes(status_root, proc.pid) >= start + more,
        what=f"{more} more changes streamed by capture {proc.pid}",
        progress=lambda: (capture_progress(status_root), size_of(proc.err_path)),
    )
    assert proc.proc.poll() is None, proc.err_path.read_text()


def _restarted(config: Path, status_root: Path) -> Capture:
    """A new capture process, once it streams."""
    proc = spawn_capture(config)
    wait_for(
        lambda: _streaming(status_root, proc.pid) or proc.proc.poll() is not None,
        what="capture streaming",
        progress=lambda: (capture_progress(status_root), size_of(proc.err_path)),
    )
    assert proc.proc.poll() is None, proc.err_path.read_text()
    return proc


def test_capture_on_three_brokers_survives_kills_fencing_and_restarts(
    fresh_db: str, tmp_path: Path, kafka_cluster3: KafkaCluster
) -> None:
    kafka = kafka_cluster3
    cluster = kafka.broker
    assert isinstance(cluster, EmbeddedKafka) and kafka.replicas == 3
    script, config = _prepare(fresh_db, tmp_path, kafka)
    # Transactions the coordinator times out within the outage of step 5 (librdkafka's default is
    # 60 s): the transaction capture holds then is aborted under it, and its producer fails fatally.
    text = config.read_text()
    config.write_text(text.replace('"log_level" = "3"', '"log_level" = "3", "transaction.timeout.ms" = "10000"', 1))
    assert config.read_text() != text
    status_root = tmp_path / "kstatus"
    rng = random.Random(7)
    bench: subprocess.Popen[bytes] | None = None
    bench_err = tmp_path / "pgbench.err"
    zombie: Capture | None = None
    proc = _restarted(config, status_root)
    try:
        with bench_err.open("wb") as err:
            bench = subprocess.Popen(
                [_pgbench(), "-n", "-c", "2", "-R", str(RATE), "-T", "3600", "-f", str(script), fresh_db],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        # 1. capture killed -9 mid-stream, twice: its open transaction is aborted by its successor.
        for _ in range(2):
            _streams_on(status_root, proc, rng.randint(RATE, 2 * RATE))
            time.sleep(rng.uniform(0.0, 0.5))
            _kill(proc)
            proc = _restarted(config, status_root)

        # 2. a zombie: a second process of the same source fences the first, whose next commit fails.
        zombie, proc = proc, spawn_capture(config)
        wait_for(
            lambda: (read_status(status_root) or {}).get("pid") == proc.pid or proc.proc.poll() is not None,
            what="the second capture's first status",
            progress=lambda: capture_progress(status_root),
        )
        assert wait_exit(zombie.proc, what="the fenced capture to stop", progress=lambda: size_of(zombie.err_path)) == 1
        assert FENCED in zombie.err_path.read_text().strip().splitlines()[-1]
        wait_for(
            lambda: _streaming(status_root, proc.pid),
            what="the second capture streaming",
            progress=lambda: capture_progress(status_root),
        )
        _streams_on(status_root, proc, RATE)

        # 3. the leader of a partition killed -9 mid-stream: capture goes on through the failover.
        leader = cluster.leader("shop.public.pgbench_accounts", 0)
        cluster.kill(leader)
        _streams_on(status_root, proc, 2 * RATE)
        cluster.start_node(leader)
        cluster.wait_ready()

        # 4. one broker restarted (a controlled shutdown), capture streaming meanwhile.
        other = cluster.leader("shop.public.pgbench_history", 1)
        cluster.stop_node(other)
        _streams_on(status_root, proc, RATE)
        cluster.start_node(other)
        cluster.wait_ready()
        _streams_on(status_root, proc, RATE)

        # 5. the whole cluster down while capture commits: it retries, and goes on once the
        # cluster is back (nothing lost or doubled); then killed -9 once more.
        cluster.down(timeout=60)
        wait_for(
            lambda: RETRYING in proc.err_path.read_text() or proc.proc.poll() is not None,
            what="capture retrying its commit while the cluster is down",
            progress=lambda: size_of(proc.err_path),
        )
        assert proc.proc.poll() is None, proc.err_path.read_text()[-2000:]
        cluster.up()
        wait_for(
            lambda: RECOVERED in proc.err_path.read_text() or proc.proc.poll() is not None,
            what="capture's commit taken after the outage",
            progress=lambda: size_of(proc.err_path),
        )
        _streams_on(status_root, proc, RATE)
        _kill(proc)
        proc = _restarted(config, status_root)
        _streams_on(status_root, proc, RATE)

        bench.send_signal(signal.SIGINT)  # its transaction in flight is rolled back, never half committed
        assert wait_exit(bench, what="pgbench to stop", progress=lambda: size_of(bench_err)) in (
            0,
            1,
            -signal.SIGINT,
        ), bench_err.read_text()
    finally:
        if bench is not None and bench.poll() is None:
            bench.kill()
            bench.wait()
        for p in (proc, zombie):
            if p is not None and p.returncode is None:
                _kill(p)
    final = cli("capture", "--config", str(config), "--until-idle", "2", progress=lambda: capture_progress(status_root))
    assert final.returncode == 0, final.stderr
    assert_exactly_once(kafka, fresh_db)


_VICTIM = """
import sys
from confluent_kafka import Producer
producer = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2], "log_level": 3})
producer.init_transactions(60)
producer.begin_transaction()
for i in range(3):
    producer.produce(sys.argv[3], key=b'{"id":%d}' % (100 + i), value=b'{"op":"c","open":true}', partition=0)
producer.flush(60)
print("flushed", flush=True)
sys.stdin.read()
"""


def _group_records(
    coordinator: GroupCoordinator, member: Membership, want: int
) -> list[tuple[bytes | None, bytes | None]]:
    """What the group member is handed: fetch until `want` records came, then until a fetch of a
    newer view of the log brings nothing more."""
    got: list[tuple[bytes | None, bytes | None]] = []
    empty = 0
    deadline = time.monotonic() + 120
    while len(got) < want or empty < 5:
        assert time.monotonic() < deadline, f"{len(got)} of {want} records handed to the group"
        batch = coordinator.fetch("g", member.member_id, member.generation)
        got += [(r.key, r.value) for r in batch.records]
        empty = empty + 1 if not batch.records else 0
        time.sleep(0.1)
    return got


def test_a_killed_writers_open_transaction_never_reaches_a_consumer_or_a_group(
    fresh_db: str, tmp_path: Path, kafka_broker: KafkaCluster
) -> None:
    """A writer killed -9 with its transaction open on the broker (records flushed, never committed):
    read_committed consumers and tributary's groups see none of it, and the records committed after
    it only once the next writer of the source (init_transactions) aborted it."""
    kafka = kafka_broker
    topic = "shop.public.t"
    kafka.make_topics(topic)
    options = kafka.options("victim")
    first = KafkaLog(options, ["shop"])
    try:
        first.source("shop").append(topic, 0, [(b'{"id":%d}' % i, b'{"op":"c"}', 1, None) for i in range(3)])
        first.commit(positions={"shop": "0/10"})
    finally:
        first.close()
    with subprocess.Popen(
        [sys.executable, "-c", _VICTIM, kafka.bootstraps, transactional_id(options, "shop"), topic],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as victim:  # closes its pipes
        try:
            assert victim.stdout is not None and victim.stdout.readline().strip() == "flushed"
        finally:
            victim.kill()  # kill -9, its transaction open on the broker
            victim.wait()
    committed = [(b'{"id":%d}' % i, b'{"op":"c"}') for i in range(3)]
    assert [(k, v) for _, _, _, k, v, _, _ in read_committed(kafka.bootstraps, [topic])] == committed
    run_migrations(fresh_db)
    with GroupCoordinator(fresh_db, tmp_path / "unused", kafka=options, auto_offset_reset="earliest") as coordinator:
        member = coordinator.join("g", [topic], member_id="m")
        assert _group_records(coordinator, member, 3) == committed  # the open transaction holds the rest back
        successor = KafkaLog(options, ["shop"])  # fences the killed writer and aborts its transaction
        try:
            assert successor.positions() == {"shop": "0/10"}
            successor.source("shop").append(topic, 0, [(b'{"id":9}', b'{"op":"u"}', 2, None)])
            successor.commit(positions={"shop": "0/20"})
        finally:
            successor.close()
        assert _group_records(coordinator, member, 1) == [(b'{"id":9}', b'{"op":"u"}')]
    everything = [(k, v) for _, _, _, k, v, _, _ in read_committed(kafka.bootstraps, [topic])]
    assert everything == [*committed, (b'{"id":9}', b'{"op":"u"}')]
