"""Benchmark: projection rebuilds on the Kafka backend, read by each `[projections] kafka_reader`
(confluent-kafka consumers in Python workers, and Spark's own Kafka source) in the same run.

The same N events (over --keys accounts, `events.account`, 8 partitions) are written to a real
Kafka broker (Apache Kafka's own, KRaft, one node on loopback: the jars `make setup` fetches; one
transaction per 10,000 records, as capture commits them) and, with --local, to a local log as well.
Then, --repeat times, rotating which goes first: `rebuild` of `account_balances` (a fold) and of
`account_totals` (a DataFrame projection) with each reader (and on the local log), each with its
own service database. Reports medians, the ratios spark/python of the medians (and each reader's
against the local log), and whether all tables are equal. The first round is reported apart
(`first`: JIT warm-up; the local log makes its Parquet copies there).

    python bench/projections_kafka.py [--events 1000000] [--keys 10000] [--repeat 3] [--local]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

import orjson  # noqa: E402
import psycopg  # noqa: E402
from confluent_kafka import Producer  # noqa: E402

from tributary.api.devdb import free_port  # noqa: E402
from tributary.api.devkafka import EmbeddedKafka  # noqa: E402
from tributary.eventstore.migrate import run_migrations  # noqa: E402
from tributary.log.kafka.options import KafkaOptions  # noqa: E402
from tributary.log.local import Log, TopicConfig, canonical_json, partition_for  # noqa: E402
from tributary.projections.records import ms_to_iso  # noqa: E402
from tributary.projections.runner import RunSettings, rebuild  # noqa: E402
from tributary.projections.spark import get_session  # noqa: E402
from tributary.projections.spark_kafka_source import connector_jars  # noqa: E402

TOPIC = "events.account"
PARTS = 8
TXN = 10_000
KINDS = ("MoneyDeposited", "MoneyDeposited", "MoneyWithdrawn")
PROJECTIONS = ("account_balances", "account_totals")
READERS = ("python", "spark")


def events(n: int, keys: int, rng: random.Random) -> list[tuple[int, bytes, bytes, int]]:
    out = []
    for i in range(n):
        stream = f"acc-{rng.randrange(keys)}"
        kind = "AccountOpened" if i < keys else KINDS[i % 3]
        amount = f"{rng.randrange(1, 100000)}.{rng.randrange(100):02d}"
        at = 1_700_000_000_000 + i * 10 - rng.randrange(0, 5000)
        value = orjson.dumps(
            {
                "id": f"e{i}",
                "stream": stream,
                "version": i,
                "type": kind,
                "schema_version": 1,
                "data": {"amount": amount, "owner": "o", "overdraft_limit": "0"},
                "metadata": {},
                "occurred_at": ms_to_iso(at),
                "recorded_at": ms_to_iso(at),
            }
        )
        key = canonical_json(stream)
        out.append((partition_for(key, PARTS), key, value, at))
    return out


def write_local(root: Path, rows: list[tuple[int, bytes, bytes, int]]) -> None:
    log = Log.open(root, writer=True)
    log.create_topic(TOPIC, TopicConfig(partitions=PARTS))
    for start in range(0, len(rows), TXN):
        for part, key, value, at in rows[start : start + TXN]:
            log.append(TOPIC, part, [(key, value, at, None)])
        log.commit()
    log.close()


def write_kafka(bootstraps: str, rows: list[tuple[int, bytes, bytes, int]]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstraps, "log_level": 3})
    # The events' timestamps are in 2023: time retention (7 days by default) would drop them at once.
    admin.create_topics([NewTopic(TOPIC, PARTS, 1, config={"retention.ms": "-1"})])[TOPIC].result(60)
    producer = Producer({"bootstrap.servers": bootstraps, "transactional.id": "bench", "linger.ms": 5, "log_level": 3})
    producer.init_transactions(60)
    for start in range(0, len(rows), TXN):
        producer.begin_transaction()
        for part, key, value, at in rows[start : start + TXN]:
            while True:
                try:
                    producer.produce(TOPIC, key=key, value=value, partition=part, timestamp=at)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.commit_transaction(60)
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstraps, "group.id": "bench", "log_level": 3})
    try:
        starts = [consumer.get_watermark_offsets(TopicPartition(TOPIC, p), 30)[0] for p in range(PARTS)]
    finally:
        consumer.close()
    if any(starts):
        raise SystemExit(f"the broker dropped the oldest records (partition starts {starts})")


def tables(dsn: str) -> dict[str, list[str]]:
    with psycopg.connect(dsn) as conn:
        return {p: [r[0] for r in conn.execute(f"SELECT t::text FROM views.{p} t ORDER BY 1")] for p in PROJECTIONS}


def summary(runs: dict[str, dict[str, list[float]]], p: str) -> dict[str, Any]:
    """One projection's figures: each run's first round apart, medians of the rest, ratios."""
    out: dict[str, Any] = {}
    for backend, by in runs.items():
        out[f"{backend}_first_s"] = round(by[p][0], 2)
        out[f"{backend}_median_s"] = round(median(by[p][1:]), 2)
        out[f"{backend}_runs_s"] = [round(x, 2) for x in by[p][1:]]
    out["spark_vs_python"] = round(median(runs["spark"][p][1:]) / median(runs["python"][p][1:]), 2)
    if "local" in runs:
        for reader in READERS:
            out[f"{reader}_vs_local"] = round(median(runs[reader][p][1:]) / median(runs["local"][p][1:]), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--local", action="store_true", help="also rebuild from a local log of the same events")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "projections_kafka.json")
    args = ap.parse_args()
    if not connector_jars():
        raise SystemExit("Spark's Kafka source is not in build/spark-kafka/lib: run `make setup`")
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-kproj-"))
    from tributary.api.devdb.embedded import EmbeddedPostgres

    cluster = EmbeddedPostgres(work / "pg")
    cluster.up()
    broker = EmbeddedKafka(work / "kafka", heap="1g")
    try:
        bootstraps = broker.up(port=free_port())
        backends = [*READERS, *(["local"] if args.local else [])]
        dsns = {}
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            for backend in backends:
                conn.execute(f"CREATE DATABASE bench_{backend}")
        for backend in backends:
            dsns[backend] = cluster.dsn(f"bench_{backend}")
            run_migrations(dsns[backend])
        rows = events(args.events, args.keys, random.Random(7))
        out: dict[str, Any] = {
            "bench": "projections_kafka",
            "events": args.events,
            "keys": args.keys,
            "master": args.master,
            "cpus": os.cpu_count(),
        }
        if args.local:
            t0 = time.perf_counter()
            write_local(work / "log", rows)
            out["write_local_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        write_kafka(bootstraps, rows)
        out["write_kafka_s"] = round(time.perf_counter() - t0, 2)
        del rows
        modules = tuple(f"tributary.projections.examples.{p}" for p in PROJECTIONS)
        kafka = KafkaOptions(bootstrap_servers=bootstraps, client={"log_level": "3"})
        settings = {
            reader: RunSettings(
                dsn=dsns[reader],
                log_root=work / "klog",
                modules=modules,
                shuffle_partitions=4,
                kafka=kafka,
                kafka_reader=reader,
            )
            for reader in READERS
        }
        if args.local:
            settings["local"] = RunSettings(
                dsn=dsns["local"], log_root=work / "log", modules=modules, shuffle_partitions=4
            )
        spark = get_session(args.master, shuffle_partitions=4)
        warm = spark.range(1000, numPartitions=4)
        warm.groupBy((warm.id % 7).alias("k")).count().collect()
        runs: dict[str, dict[str, list[float]]] = {b: {p: [] for p in PROJECTIONS} for b in backends}
        for i in range(args.repeat + 1):  # the first round is reported apart (JIT; the local log's Parquet copies)
            order = backends[i % len(backends) :] + backends[: i % len(backends)]
            for backend in order:
                for p in PROJECTIONS:
                    runs[backend][p].append(rebuild(p, settings[backend], spark=spark).seconds)
            print(f"round {i}: " + json.dumps({b: {p: round(v[-1], 2) for p, v in r.items()} for b, r in runs.items()}))
        found = {b: tables(dsns[b]) for b in backends}
        out["tables_equal"] = all(found[b] == found["python"] for b in backends)
        out["differing"] = {
            f"{b}/{p}": [
                sorted(set(found[b][p]) - set(found["python"][p]))[:3],
                sorted(set(found["python"][p]) - set(found[b][p]))[:3],
            ]
            for b in backends
            for p in PROJECTIONS
            if found[b][p] != found["python"][p]
        }
        for p in PROJECTIONS:
            out[p] = summary(runs, p)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
        print(json.dumps(out, indent=1))
    finally:
        broker.down(timeout=60)
        cluster.down()


if __name__ == "__main__":
    main()
