"""Projections on the Kafka backend where Kafka differs on purpose, with each reader (confluent-kafka
consumers in Python workers, and Spark's own Kafka source): a run's frame holds exactly the committed
records of each offset range (offsets are not contiguous: each transaction's commit marker takes one),
records of open or aborted transactions never reach a view, and both readers give the same records.
Rebuild and incremental runs on every backend are in tests/integration/contract/test_projections_contract.py."""

# ruff: noqa: F811  # `spark`, imported below, is the tests' parameter

from __future__ import annotations

import contextlib
import dataclasses
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.kafka.helpers import read_committed, write_kafka_config
from tests.integration.projections.conftest import spark  # noqa: F401  # the suite's one SparkSession
from tests.integration.projections.orders_views import (
    NAMES,
    PROJECTIONS,
    TOPIC,
    capture_until_idle,
    expected_views,
    views,
)
from tests.kafka_fixtures import ON_BROKER, KafkaCluster
from tributary.api.settings.config import load_settings
from tributary.eventstore.migrate import run_migrations
from tributary.log.kafka.clients import with_logger
from tributary.log.local import canonical_json, partition_for
from tributary.projections.kafka_source import KafkaSource
from tributary.projections.records import default_event_time
from tributary.projections.runner import RunSettings, rebuild, run
from tributary.projections.source import RECORD_SCHEMA
from tributary.projections.spark_kafka_source import SparkKafkaSource, connector_jars

pytestmark = [pytest.mark.integration, ON_BROKER]  # the mock hands aborted and open records to readers

SOURCES = {"python": KafkaSource, "spark": SparkKafkaSource}


@pytest.fixture(params=["python", "spark"])
def reader(request: pytest.FixtureRequest, spark: Any) -> str:
    """`[projections] kafka_reader`: each test with both readers (the session has Spark's Kafka
    source on its classpath when `make setup` fetched it)."""
    if request.param == "spark" and not connector_jars():
        pytest.fail("Spark's Kafka source is not in build/spark-kafka/lib: run `make setup`")
    return str(request.param)


def _setup(tmp_path: Path, dsn: str, kafka: KafkaCluster, reader: str) -> Path:
    kafka.prepare(TOPIC)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL, amount int NOT NULL)")
        conn.execute("INSERT INTO orders SELECT g, 'c' || (g % 4), g FROM generate_series(1, 30) g")
    (tmp_path / "kafka_projections.py").write_text(PROJECTIONS)
    config = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn=dsn,
        log_root=tmp_path / "log",
        bootstraps=kafka.bootstraps,
        create_topics=kafka.creates_topics,
    )
    text = config.read_text().replace('include = ["public.*"]', 'include = ["public.orders"]')
    config.write_text(
        f'[service]\ndsn = "{dsn}"\n\n[projections]\nmodules = ["{tmp_path / "kafka_projections.py"}"]\n'
        f'mirror = ["{TOPIC}"]\nspark_master = "local[2]"\nkafka_reader = "{reader}"\n' + text
    )
    run_migrations(dsn)  # what `tributary init` does: capture and projections refuse before it
    capture_until_idle(config)
    return config


def _settings(config: Path, reader: str) -> RunSettings:
    s = RunSettings.from_settings(load_settings(config))
    assert s.kafka is not None and s.kafka.bootstrap_servers  # [log] backend = "kafka" reaches the runner
    assert s.kafka_reader == reader  # so does [projections] kafka_reader
    return dataclasses.replace(s, kafka_split_offsets=7)  # several ranges per partition


def test_the_frame_holds_the_committed_records_of_each_range(
    fresh_db: str, tmp_path: Path, kafka: KafkaCluster, spark: Any, reader: str
) -> None:
    config = _setup(tmp_path, fresh_db, kafka, reader)
    s = _settings(config, reader)
    assert s.kafka is not None
    seen = read_committed(kafka.bootstraps, [TOPIC])  # an independent read_committed consumer
    source = SOURCES[reader](s.kafka, split_offsets=3)
    try:
        hi = source.ends([TOPIC, "shop.public.nothing"])
        assert sorted(hi) == [(TOPIC, p) for p in range(3)]
        lo = {tp: end // 3 for tp, end in hi.items()}  # from inside each partition
        frame = source.records_frame(
            spark, modules=s.modules, mirror=s.mirror, name="customer_folds", topics=[TOPIC], lo=lo, hi=hi
        )
        assert frame.schema == spark.createDataFrame([], RECORD_SCHEMA).schema  # the local log's
        rows = frame.collect()
    finally:
        source.close()
    want = [r for r in seen if lo[(r[0], r[1])] <= r[2] < hi[(r[0], r[1])]]
    assert len(want) > 10
    assert len(want) < len(seen)
    # Offsets are not contiguous (each transaction's commit marker takes one): counted, not computed.
    assert sum(hi.values()) - sum(lo.values()) > len(want)
    customers = Counter(orjson.loads(r[4])["after"]["customer"] for r in want if r[4] and b'"op":"r"' in r[4])
    got = list(rows)
    assert sorted((r["topic"], r["partition"], r["offset"]) for r in got) == sorted(
        (t, p, o) for t, p, o, k, v, _, _ in want if v is not None and b'"op":"r"' in v
    )  # the fold's key function keeps snapshot reads and inserts; schema records are filtered
    by_offset = {(t, p, o): (k, v, ts) for t, p, o, k, v, _, ts in want}
    for r in got:
        key, value, ts = by_offset[(r["topic"], r["partition"], r["offset"])]
        assert (r["key"], r["value"], r["timestamp"], r["headers"]) == (key.decode(), value.decode(), ts, None)
        assert r["event_time"] == default_event_time(TOPIC, orjson.loads(value), ts)
        assert orjson.loads(r["pkey"]) == orjson.loads(value)["after"]["customer"]
    assert Counter(orjson.loads(r["pkey"]) for r in got) == customers


def _fake_insert(row_id: int) -> tuple[bytes, bytes]:
    """A CDC insert as capture writes it (enough of it for the projections above)."""
    key = orjson.dumps({"id": row_id})
    value = orjson.dumps(
        {
            "before": None,
            "after": {"id": row_id, "customer": "ghost", "amount": 1000},
            "source": {"ts_ms": 1, "table": "orders", "schema": "public"},
            "op": "c",
            "ts_ms": 1,
        }
    )
    return key, value


def test_open_and_aborted_transactions_never_reach_a_view(
    fresh_db: str, tmp_path: Path, kafka: KafkaCluster, spark: Any, reader: str
) -> None:
    from confluent_kafka import KafkaException, Producer

    config = _setup(tmp_path, fresh_db, kafka, reader)
    s = _settings(config, reader)
    assert s.kafka is not None
    source = SOURCES[reader](s.kafka)
    open_on = (partition_for(canonical_json({"id": 31}), 3) + 1) % 3  # not where row 31 goes
    # The transaction stays open across the rebuilds: a loaded machine's must not outlast the
    # coordinator's timeout (librdkafka's default 60 s), which would abort and fence it under the test.
    producer = Producer(
        with_logger(
            {
                "bootstrap.servers": kafka.bootstraps,
                "transactional.id": f"t-{uuid.uuid4().hex}",
                "transaction.timeout.ms": 900_000,
            }
        )
    )
    try:
        before = source.ends([TOPIC])
        producer.init_transactions(30)
        producer.begin_transaction()
        key, value = _fake_insert(1001)
        producer.produce(TOPIC, key=key, value=value, partition=open_on)
        producer.flush(30)  # an open transaction, on the broker
        assert source.ends([TOPIC])[(TOPIC, open_on)] == before[(TOPIC, open_on)]  # the last stable offset
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("INSERT INTO orders VALUES (31, 'c1', 31)")
        capture_until_idle(config)
        t0 = time.monotonic()
        for name in NAMES:
            rebuild(name, s, spark=spark)
        assert time.monotonic() - t0 < 120  # the open transaction is not waited on
        inserted = [(g, f"c{g % 4}", g) for g in range(1, 31)] + [(31, "c1", 31)]
        assert views(fresh_db) == expected_views(fresh_db, inserted)
        producer.abort_transaction(30)
        producer.begin_transaction()
        key, value = _fake_insert(1002)
        for partition in range(3):
            producer.produce(TOPIC, key=key, value=value, partition=partition)
        producer.flush(30)
        producer.abort_transaction(30)
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("INSERT INTO orders VALUES (32, 'c2', 32)")
        capture_until_idle(config)
        for name in NAMES:
            run(name, s, spark=spark)
        assert views(fresh_db) == expected_views(fresh_db, [*inserted, (32, "c2", 32)])
    finally:
        source.close()
        with contextlib.suppress(KafkaException):  # a failed test's producer may be fenced: its error is said
            producer.flush(5)


EVENTS = "events.thing"
EVENT_PROJECTIONS = f'''
from tributary.projections.definition import Fold, Projection, Table

TOPIC = "{EVENTS}"
TABLE = Table.of({{"k": "text", "n": "bigint"}}, ["k"])
FOLD = Fold(initial=lambda key: {{"k": key, "n": 0}}, apply=lambda s, r: {{**s, "n": s["n"] + 1}}, result=lambda s: s)


def by_type(record):
    return None if record.value is None else record.value.get("type")


def build(records):
    return records.groupBy("pkey").count().selectExpr("pkey AS k", "count AS n")


PROJECTIONS = [
    Projection(name="plain", version=1, topics=(TOPIC,), table=TABLE, fold=FOLD),
    Projection(name="keyed", version=1, topics=(TOPIC,), table=TABLE, key=by_type, fold=FOLD),
    Projection(name="frame", version=1, topics=(TOPIC,), table=TABLE, build=build),
]
'''
# Headers as the event store writes them, one given whole (not a JSON object), none, a header
# without a value, text a JSON writer must escape; values with and without an `occurred_at`.
HEADERS: list[list[tuple[str, bytes | None]] | None] = [
    [("correlation_id", b"c-1"), ("causation_id", b"e-0")],
    None,
    [("tributary.headers", b"[1,2]")],
    [("note", 'é "q" \\ \n\t\x01 ☃'.encode())],
    [("empty", None)],
]


def _events(n: int) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]]:
    out: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]] = []
    for i in range(n):
        occurred: dict[str, Any] = (
            {"occurred_at": f"2026-01-0{1 + i % 5}T10:00:0{i % 10}.{i:03d}+01:00"}
            if i % 4
            else {"occurred_at": 1700000000000 + i}  # a number, not an ISO-8601 time: the log time counts
        )
        value = orjson.dumps({"id": f"e{i}", "stream": f"s{i % 7}", "type": f"T{i % 3}", "data": {"i": i}, **occurred})
        out.append((orjson.dumps(f"s{i % 7}"), None if i % 11 == 10 else value, HEADERS[i % len(HEADERS)]))
    out.append((None, orjson.dumps({"type": "T0", "id": "keyless"}), None))
    return out


def test_both_readers_give_the_same_records(kafka: KafkaCluster, tmp_path: Path, spark: Any) -> None:
    """Same columns, same values, for each kind of projection: headers, tombstones, keyless
    records, event times, keys; aborted records read by neither."""
    from confluent_kafka import Producer

    if not connector_jars():
        pytest.fail("Spark's Kafka source is not in build/spark-kafka/lib: run `make setup`")
    kafka.create(EVENTS, 3)
    # The transaction stays open across the rebuilds: a loaded machine's must not outlast the
    # coordinator's timeout (librdkafka's default 60 s), which would abort and fence it under the test.
    producer = Producer(
        with_logger(
            {
                "bootstrap.servers": kafka.bootstraps,
                "transactional.id": f"t-{uuid.uuid4().hex}",
                "transaction.timeout.ms": 900_000,
            }
        )
    )
    producer.init_transactions(30)
    for i, (key, value, headers) in enumerate(_events(60)):
        if i % 20 == 0:
            producer.begin_transaction()
        producer.produce(EVENTS, key=key, value=value, partition=i % 3, headers=headers)
        if i % 20 == 19:
            producer.commit_transaction(30)
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(EVENTS, key=b'"ghost"', value=b'{"type":"T9"}', partition=0)
    producer.flush(30)
    producer.abort_transaction(30)
    (tmp_path / "event_projections.py").write_text(EVENT_PROJECTIONS)
    modules = (str(tmp_path / "event_projections.py"),)
    options = kafka.options("unused")
    seen = {}
    for reader, kind in SOURCES.items():
        source = kind(options, split_offsets=4)
        try:
            hi = source.ends([EVENTS])
            lo = {tp: 1 for tp in hi}  # from inside each partition
            for name in ("plain", "keyed", "frame"):
                frame = source.records_frame(
                    spark, modules=modules, mirror=(), name=name, topics=[EVENTS], lo=lo, hi=hi
                )
                columns = [c for c in frame.columns if c != "value_v"]
                if name == "frame":  # the value as a VARIANT too, as the projection reads it
                    frame = frame.selectExpr(*columns, "to_json(value_v) AS value_v")
                    columns.append("value_v")
                seen[(reader, name)] = sorted(tuple(r) for r in frame.select(*columns).collect())
        finally:
            source.close()
    for name in ("plain", "keyed", "frame"):
        assert seen[("spark", name)] == seen[("python", name)], name
    rows = seen[("python", "plain")]
    assert len(rows) == 60 + 1 - 3  # every committed record but each partition's first; no aborted one
    assert {r[6] for r in rows} == {
        None,
        '{"correlation_id":"c-1","causation_id":"e-0"}',
        "[1,2]",
        orjson.dumps({"note": 'é "q" \\ \n\t\x01 ☃'}).decode(),
        '{"empty":null}',
    }
    assert {r[5] is None for r in rows} == {True, False} and {r[4] is None for r in rows} == {True, False}
    assert len({r[7] for r in rows}) > 30  # event times: each `occurred_at` its own
    assert {r[8] for r in seen[("python", "keyed")]} == {'"T0"', '"T1"', '"T2"'}
