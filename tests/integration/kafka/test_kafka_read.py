"""`tributary log verify` on the Kafka backend, where it differs on purpose from the local log's: the
broker checks its own records, so verify checks the offsets topic and each source's position, and
refuses `--repair`. What both backends' readers share (live keys, positions, `log cat --follow`, a
re-snapshot's deletes) is in tests/integration/contract/."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import cli, wait_for
from tests.integration.capture.test_resnapshot import FILL, TABLES
from tests.integration.kafka.helpers import write_kafka_config
from tests.kafka_fixtures import KafkaCluster
from tributary.log.kafka.options import OFFSETS_TOPIC
from tributary.log.kafka.read import kafka_positions, kafka_records
from tributary.log.kafka.writer import KafkaLog
from tributary.log.local import TopicConfig

pytestmark = pytest.mark.integration


def test_log_verify_on_kafka(fresh_db: str, tmp_path: Path, kafka: KafkaCluster) -> None:
    kafka.prepare("shop.public.items")
    if kafka.creates_topics:  # the offsets topic there, as an operator made it on the mock: capture not run yet
        kafka.create(OFFSETS_TOPIC, 1)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=20))
    config = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn=fresh_db,
        log_root=tmp_path / "kstatus",
        bootstraps=kafka.bootstraps,
        create_topics=kafka.creates_topics,
    )
    text = config.read_text()
    config.write_text(text + text[text.index("[[sources]]") :].replace('name = "shop"', 'name = "crm"'))
    before = cli("log", "verify", "--config", str(config))  # capture never ran for either source
    assert before.returncode == 0, before.stderr
    assert "source shop: no position yet" in before.stdout and "source crm: no position yet" in before.stdout
    config.write_text(text)  # capture runs for shop only
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    position = kafka_positions(kafka.options("v"))["shop"]
    done = cli("log", "verify", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert f"source shop: position {position}, 1 topic(s)" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith(f"ok: Kafka at {kafka.bootstraps}")
    refused = cli("log", "verify", "--repair", "--config", str(config))
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "tributary: --repair applies to the local log: on Kafka the broker repairs its own logs"
    ]


def test_log_verify_on_kafka_without_the_offsets_topic_fails_with_one_line(
    tmp_path: Path, kafka_mock: KafkaCluster
) -> None:
    config = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn="postgresql://unused",
        log_root=tmp_path / "kstatus",
        bootstraps=kafka_mock.bootstraps,
        create_topics=False,
    )
    res = cli("log", "verify", "--config", str(config))
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "problem: no offsets topic '__tributary_offsets': capture has not run against this cluster",
        f"tributary: 1 problem(s) found on Kafka at {kafka_mock.bootstraps}",
    ]


def test_a_read_to_the_end_ends_while_a_writer_goes_on_committing(kafka_broker: KafkaCluster) -> None:
    """`log cat` and every read "to the end now" stop at the end the read began with, even while
    a writer commits a transaction every few milliseconds (heartbeats, a busy table)."""
    options = kafka_broker.options("busy")
    log = KafkaLog(options, ["busy"])
    admin = KafkaLog(options)  # its own client: the writer's is the writer thread's
    stop = threading.Event()

    def write() -> None:
        n = 0
        while not stop.is_set():
            log.append("busy.t", 0, [(b'{"id":%d}' % n, b"{}", None, None)], source="busy")
            log.commit()
            n += 1

    log.create_topic("busy.t", TopicConfig(partitions=1, policy="delete"))
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    read: list[int] = []
    try:
        wait_for(lambda: sum(admin.end_offsets("busy.t")) > 40, timeout=120, what="records written")
        reader = threading.Thread(target=lambda: read.append(len(list(kafka_records(options, "busy.t")))), daemon=True)
        reader.start()
        reader.join(120)  # a read of a few hundred records: seconds, unless it chases the writer for ever
        assert not reader.is_alive(), "the read chased the writer's commits instead of ending"
    finally:
        stop.set()
        writer.join(60)
        log.close()
        admin.close()
    assert read and read[0] > 20
