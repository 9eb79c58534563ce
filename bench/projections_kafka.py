"""Benchmark: projection rebuilds reading Kafka (librdkafka's mock cluster) against the same
rebuilds reading the local log, in the same run.

The same N events (over --keys accounts, `events.account`, 8 partitions) are written to a local
log and to a mock Kafka cluster (`tests/kafka_mock.py`; one transaction per 10,000 records, as
capture commits them). Then, --repeat times, alternating which backend goes first: `rebuild` of
`account_balances` (a fold) and of `account_totals` (a DataFrame projection) on each backend, each
backend with its own service database. Reports medians, the ratio kafka/local of the medians, and
whether the two backends' tables are equal. The local log's first rebuild also makes its Parquet
copies (reported apart: `first`); Kafka has none. The mock is a protocol-level test double in
one process, not a performance reference for a Kafka cluster; it also keeps only about the last
5 MB of each partition (older records are dropped as by retention: the script stops if it did), so
N stays around 100,000 events.

    python bench/projections_kafka.py [--events 100000] [--keys 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
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

from tributary.eventstore.migrate import run_migrations  # noqa: E402
from tributary.log.kafka.options import KafkaOptions  # noqa: E402
from tributary.log.local import Log, TopicConfig, canonical_json, partition_for  # noqa: E402
from tributary.projections.records import ms_to_iso  # noqa: E402
from tributary.projections.runner import RunSettings, rebuild  # noqa: E402
from tributary.projections.spark import get_session  # noqa: E402

TOPIC = "events.account"
PARTS = 8
TXN = 10_000
KINDS = ("MoneyDeposited", "MoneyDeposited", "MoneyWithdrawn")
PROJECTIONS = ("account_balances", "account_totals")


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
    producer = Producer({"bootstrap.servers": bootstraps, "transactional.id": "bench", "linger.ms": 5, "log_level": 3})
    producer.init_transactions(30)
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
        raise SystemExit(f"the mock cluster dropped the oldest records (partition starts {starts}): use fewer --events")


def tables(dsn: str) -> dict[str, list[str]]:
    with psycopg.connect(dsn) as conn:
        return {p: [r[0] for r in conn.execute(f"SELECT t::text FROM views.{p} t ORDER BY 1")] for p in PROJECTIONS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "projections_kafka.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-kproj-"))
    from tributary.api.devdb.embedded import EmbeddedPostgres

    cluster = EmbeddedPostgres(work / "pg")
    cluster.up()
    mock = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "kafka_mock.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        bufsize=1,
    )
    try:
        assert mock.stdin is not None and mock.stdout is not None
        bootstraps = mock.stdout.readline().strip()
        mock.stdin.write(f"create {TOPIC} {PARTS} 1\n")
        mock.stdin.flush()
        assert mock.stdout.readline().strip() == "ok"
        dsns = {}
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            for backend in ("local", "kafka"):
                conn.execute(f"CREATE DATABASE bench_{backend}")
        for backend in ("local", "kafka"):
            dsns[backend] = cluster.dsn(f"bench_{backend}")
            run_migrations(dsns[backend])
        rows = events(args.events, args.keys, random.Random(7))
        t0 = time.perf_counter()
        write_local(work / "log", rows)
        local_write = time.perf_counter() - t0
        t0 = time.perf_counter()
        write_kafka(bootstraps, rows)
        kafka_write = time.perf_counter() - t0
        modules = tuple(f"tributary.projections.examples.{p}" for p in PROJECTIONS)
        settings = {
            "local": RunSettings(dsn=dsns["local"], log_root=work / "log", modules=modules, shuffle_partitions=4),
            "kafka": RunSettings(
                dsn=dsns["kafka"],
                log_root=work / "klog",
                modules=modules,
                shuffle_partitions=4,
                kafka=KafkaOptions(bootstrap_servers=bootstraps, client={"log_level": "3"}),
            ),
        }
        spark = get_session(args.master, shuffle_partitions=4)
        warm = spark.range(1000, numPartitions=4)
        warm.groupBy((warm.id % 7).alias("k")).count().collect()
        runs: dict[str, dict[str, list[float]]] = {b: {p: [] for p in PROJECTIONS} for b in settings}
        for i in range(args.repeat + 1):  # the first round is reported apart (Parquet copies, JIT)
            order = ["local", "kafka"] if i % 2 == 0 else ["kafka", "local"]
            for backend in order:
                for p in PROJECTIONS:
                    runs[backend][p].append(rebuild(p, settings[backend], spark=spark).seconds)
        equal = tables(dsns["local"]) == tables(dsns["kafka"])
        out: dict[str, Any] = {
            "bench": "projections_kafka",
            "events": args.events,
            "keys": args.keys,
            "master": args.master,
            "cpus": os.cpu_count(),
            "write_local_s": round(local_write, 2),
            "write_kafka_mock_s": round(kafka_write, 2),
            "tables_equal": equal,
        }
        for p in PROJECTIONS:
            loc, kaf = runs["local"][p], runs["kafka"][p]
            out[p] = {
                "local_first_s": round(loc[0], 2),
                "kafka_first_s": round(kaf[0], 2),
                "local_median_s": round(median(loc[1:]), 2),
                "kafka_median_s": round(median(kaf[1:]), 2),
                "local_runs_s": [round(x, 2) for x in loc[1:]],
                "kafka_runs_s": [round(x, 2) for x in kaf[1:]],
                "kafka_vs_local": round(median(kaf[1:]) / median(loc[1:]), 2),
            }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
        print(json.dumps(out, indent=1))
    finally:
        mock.kill()
        mock.wait()
        cluster.down()


if __name__ == "__main__":
    main()
