"""Consumers over HTTP, each figure against a baseline measured in the same run (embedded Postgres):

1. throughput: one consumer-group member pulling batches over HTTP (`tributary_client.Consumer`)
   vs `tributary log cat` over the same topic (reading the files directly); target ≥ 0.5×;
2. latency: commit in PostgreSQL → record at an SSE consumer (`GET …/stream`), at a steady
   `--tps`, vs commit → visible in the log (a reader polling the log's files, the same moment);
   target SSE p99 ≤ 100 ms;
3. fan-out: `--subscribers` SSE streams, each in its own group, each must receive every record;
4. kafka_throughput: part 1 on the Kafka backend (`[log] backend = "kafka"`, librdkafka's mock
   cluster, `tests/kafka_mock.py`): the member pulling over HTTP vs `tributary log cat` reading the
   same topic from the cluster (read_committed) — for information: the mock is no reference for a
   real Kafka;
5. kafka_readers: the coordinator's Kafka view reading a topic in pulls of `--pull-records` per
   partition in turn, its readers kept (`KafkaView`) vs a new view (new Kafka clients) per pull.

    .venv/bin/python bench/consumers.py [--records 100000] [--seconds 20] [--tps 1000] [--writers 4] [--subscribers 50] [--repeat 3]
    .venv/bin/python bench/consumers.py --only kafka_throughput --records 50000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tributary_client import Consumer  # noqa: E402

from bench._paced import paced_writes  # noqa: E402
from tributary.api.devdb.embedded import EmbeddedPostgres, free_port  # noqa: E402
from tributary.eventstore.migrate import run_migrations  # noqa: E402
from tributary.log.local import Log, TopicConfig, canonical_json  # noqa: E402

CLI = [sys.executable, "-c", "from tributary.api.cli.main import main; main()"]
TOPIC = "bench.public.items"
FAN_TOPIC = "bench.public.fan"
LAT_TOPIC = "lat.public.lat"


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] if s else float("nan")


@contextlib.contextmanager
def _serve(config: Path, port: int, err: Path) -> Iterator[str]:
    proc = subprocess.Popen(
        [*CLI, "serve", "--config", str(config)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err.open("w")
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"serve did not start: {err.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _fill(log: Log, topic: str, n: int, start: int = 0, partitions: int = 4) -> None:
    if topic not in log.topics():
        log.create_topic(topic, TopicConfig(partitions=partitions))
    pad = "x" * 120
    for lo in range(start, start + n, 5000):
        by_part: dict[int, list[tuple[bytes, bytes, int, None]]] = {}
        for i in range(lo, min(lo + 5000, start + n)):
            key = canonical_json({"id": i})
            value = orjson.dumps({"after": {"id": i, "pad": pad}, "op": "c"})
            by_part.setdefault(log.partition_for(topic, key), []).append((key, value, int(time.time() * 1000), None))
        for p, recs in by_part.items():
            log.append(topic, p, recs)
        log.commit()


def _cat_rate(root: Path, n: int) -> float:
    t0 = time.perf_counter()
    out = subprocess.run([*CLI, "log", "cat", TOPIC, "--root", str(root)], cwd=ROOT, capture_output=True, check=True)
    elapsed = time.perf_counter() - t0
    got = out.stdout.count(b"\n")
    assert got == n, f"log cat printed {got} records, expected {n}"
    return n / elapsed


def _kafka_fill(bootstraps: str, topic: str, n: int, partitions: int = 4) -> None:
    """`n` records in transactions of 5,000, as capture writes them (a commit marker after each)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstraps, "transactional.id": "bench-fill", "log_level": "3"})
    producer.init_transactions(30)
    pad = "x" * 120
    for lo in range(0, n, 5000):
        producer.begin_transaction()
        for i in range(lo, min(lo + 5000, n)):
            key = canonical_json({"id": i})
            value = orjson.dumps({"after": {"id": i, "pad": pad}, "op": "c"})
            while True:
                try:
                    producer.produce(topic, key=key, value=value, partition=i % partitions)
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.commit_transaction(60)


def _kafka_cat_rate(config: Path, n: int) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(
        [*CLI, "log", "cat", TOPIC, "--config", str(config)], cwd=ROOT, capture_output=True, check=True
    )
    elapsed = time.perf_counter() - t0
    got = out.stdout.count(b"\n")
    assert got == n, f"log cat printed {got} records, expected {n}"
    return n / elapsed


def _kafka_throughput(dsn: str, work: Path, records: int, repeat: int, parts: set[str], pull: int) -> dict[str, Any]:
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
        mock.stdin.write(f"create {TOPIC} 4 1\n")
        mock.stdin.flush()
        assert mock.stdout.readline().strip() == "ok"
        _kafka_fill(bootstraps, TOPIC, records)
        out: dict[str, Any] = {}
        if "kafka_readers" in parts:
            kept_rates: list[float] = []
            fresh_rates: list[float] = []
            for _ in range(repeat):
                kept_rates.append(_kafka_pulls(bootstraps, records, pull, fresh=False))
                fresh_rates.append(_kafka_pulls(bootstraps, records, pull, fresh=True))
            out["kafka_readers"] = {
                "records": records,
                "pull_records": pull,
                "kept_per_s": statistics.median(kept_rates),
                "new_per_pull_per_s": statistics.median(fresh_rates),
                "ratio_kept_vs_new": statistics.median(k / f for k, f in zip(kept_rates, fresh_rates, strict=True)),
                "runs": {"kept": kept_rates, "new_per_pull": fresh_rates},
            }
        if "kafka_throughput" not in parts:
            return out
        port = free_port()
        config = work / "kafka.toml"
        config.write_text(
            f'[service]\ndsn = "{dsn}"\n[log]\nbackend = "kafka"\nroot = "{work / "klog"}"\n'
            f'[log.kafka]\nbootstrap_servers = "{bootstraps}"\ncreate_topics = false\n'
            'client = { "log_level" = "3" }\n'
            f"[api]\nport = {port}\n"
        )
        cat_rates: list[float] = []
        http_rates: list[float] = []
        with _serve(config, port, work / "serve-kafka.err") as url:
            for i in range(repeat):  # interleaved: both see the same neighbours
                cat_rates.append(_kafka_cat_rate(config, records))
                http_rates.append(_http_rate(url, f"ktp-{i}", records))
        out["kafka_throughput"] = {
            "records": records,
            "log_cat_per_s": statistics.median(cat_rates),
            "http_pull_per_s": statistics.median(http_rates),
            "ratio_http_vs_cat": statistics.median(h / c for h, c in zip(http_rates, cat_rates, strict=True)),
            "runs": {"log_cat": cat_rates, "http_pull": http_rates},
        }
        return out
    finally:
        mock.kill()
        mock.wait()


def _kafka_pulls(bootstraps: str, n: int, pull: int, *, fresh: bool) -> float:
    """Records/s reading `n` records of TOPIC (4 partitions) in pulls of `pull` records, partitions
    in turn: one KafkaView throughout, or (`fresh`) a new one (new clients) per pull."""
    from tributary.log.kafka.options import KafkaOptions
    from tributary.log.kafka.view import KafkaView

    options = KafkaOptions(bootstrap_servers=bootstraps, client={"log_level": "3"})
    kept = None if fresh else KafkaView(options)
    position = dict.fromkeys(range(4), 0)
    got = 0
    t0 = time.perf_counter()
    while got < n:
        for p in range(4):
            view = kept or KafkaView(options)
            view.refresh_if_older(0.05)
            it = view.read(TOPIC, p, position[p])
            for i, record in enumerate(it, 1):
                position[p], got = record.offset + 1, got + 1
                if i == pull:
                    break
            close = getattr(it, "close", None)
            if close is not None:
                close()
            if view is not kept:
                view.close()
    elapsed = time.perf_counter() - t0
    if kept is not None:
        kept.close()
    return n / elapsed


def _http_rate(url: str, group: str, n: int) -> float:
    t0 = time.perf_counter()
    got = 0
    with Consumer(
        url, group=group, topics=[TOPIC], auto_offset_reset="earliest", max_records=5000, max_bytes=8 << 20, wait_ms=500
    ) as consumer:
        while got < n:
            got += len(consumer.poll())
        consumer.commit()
    elapsed = time.perf_counter() - t0
    return n / elapsed


async def _sse(
    client: httpx.AsyncClient,
    url: str,
    group: str,
    topic: str,
    want: int,
    ready: asyncio.Event,
    out: list[float],
    reset: str = "latest",
) -> int:
    """One SSE subscriber: joins `group`, streams until `want` records arrived; appends each
    record's arrival latency (now − the row's `sent`, if it has one) to `out`; returns the count."""
    joined = (
        await client.post(f"{url}/groups/{group}/members", json={"topics": [topic], "auto_offset_reset": reset})
    ).json()
    got = 0
    params = {"generation": joined["generation"]}
    async with client.stream("GET", f"{url}/groups/{group}/members/{joined['member_id']}/stream", params=params) as r:
        ready.set()
        event = ""
        async for line in r.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "record":
                record = orjson.loads(line[5:])
                value = record.get("value") or {}
                sent = (value.get("after") or {}).get("sent")
                if sent:
                    out.append(time.time() - float(sent))
                got += 1
                if got >= want:
                    break
    return got


def _latency(
    cluster: EmbeddedPostgres, work: Path, *, seconds: float, tps: int, writers: int, tag: str
) -> dict[str, float]:
    dsn = cluster.dsn()
    slot = f"bench_consumers_{tag}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS lat")
        conn.execute("CREATE TABLE lat (id bigint PRIMARY KEY, sent double precision)")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (slot,))
    root = work / f"log-lat-{tag}"
    port = free_port()
    config = work / f"lat-{tag}.toml"
    config.write_text(
        f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{root}"\npartitions = 4\n[api]\nport = {port}\n'
        f"[capture]\ncapture_eventstore = false\n"
        f'[[sources]]\nname = "lat"\ndsn = "{dsn}"\nslot = "{slot}"\ninclude = ["public.lat"]\nsnapshot = "never"\n'
    )
    capture = subprocess.Popen(
        [*CLI, "capture", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=(work / f"capture-{tag}.err").open("w"),
    )
    try:
        # the topic appears with the first change
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO lat VALUES (0, 0)")
        deadline = time.monotonic() + 60
        while not (root / LAT_TOPIC).exists():
            if time.monotonic() > deadline:
                raise SystemExit("capture did not create the topic")
            time.sleep(0.1)
        with _serve(config, port, work / f"serve-lat-{tag}.err") as url:
            sse: list[float] = []
            in_log: list[float] = []
            stop = threading.Event()

            def follow_log() -> None:
                nxt: dict[int, int] = {}
                with Log.open(root) as log:
                    for p in range(4):
                        nxt[p] = log.end_offsets(LAT_TOPIC)[p]
                    while not stop.is_set():
                        log.refresh()
                        for p in range(4):
                            for rec in log.read(LAT_TOPIC, p, nxt[p]):
                                nxt[p] = rec.offset + 1
                                after = orjson.loads(rec.value).get("after") if rec.value else None
                                if after and after.get("sent"):
                                    in_log.append(time.time() - float(after["sent"]))
                        time.sleep(0.001)

            def stream() -> None:
                async def go() -> None:
                    ready = asyncio.Event()
                    async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=None)) as client:
                        task = asyncio.create_task(_sse(client, url, f"lat-{tag}", LAT_TOPIC, 1 << 60, ready, sse))
                        await ready.wait()
                        started.set()
                        while not stop.is_set():
                            await asyncio.sleep(0.05)
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task

                asyncio.run(go())

            started = threading.Event()
            threads = [threading.Thread(target=follow_log), threading.Thread(target=stream)]
            for t in threads:
                t.start()
            started.wait(30)
            time.sleep(1)
            # Several connections share the pace: one commit's fsync at a time would cap a single one.
            counts = [0] * writers

            def write(w: int) -> None:
                counts[w] = paced_writes(
                    dsn,
                    "INSERT INTO lat VALUES (%s, extract(epoch from clock_timestamp()))",
                    seconds,
                    tps // writers,
                    lambda n: (1 + w + n * writers,),
                )

            pacers = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
            for t in pacers:
                t.start()
            for t in pacers:
                t.join()
            sent = sum(counts)
            time.sleep(2)
            stop.set()
            for t in threads:
                t.join()
    finally:
        capture.terminate()
        capture.wait(timeout=60)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        shutil.rmtree(root, ignore_errors=True)
    sse_ms = [v * 1000 for v in sse]
    log_ms = [v * 1000 for v in in_log]
    return {
        "sent": sent,
        "tps_achieved": sent / seconds,
        "sse_seen": len(sse_ms),
        "sse_p50_ms": _pct(sse_ms, 0.5),
        "sse_p99_ms": _pct(sse_ms, 0.99),
        "log_seen": len(log_ms),
        "log_p50_ms": _pct(log_ms, 0.5),
        "log_p99_ms": _pct(log_ms, 0.99),
    }


def _fan_out(url: str, log: Log, subscribers: int, records: int, run: int) -> dict[str, Any]:
    topic = f"{FAN_TOPIC}{run}"  # a fresh topic per run, empty when the subscribers join
    log.create_topic(topic, TopicConfig(partitions=4))
    log.commit()

    async def go() -> dict[str, Any]:
        limits = httpx.Limits(max_connections=subscribers + 10)
        async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=None), limits=limits) as client:
            readies = [asyncio.Event() for _ in range(subscribers)]
            sinks: list[list[float]] = [[] for _ in range(subscribers)]
            tasks = [
                asyncio.create_task(
                    _sse(client, url, f"fan-{run}-{i}", topic, records, readies[i], sinks[i], "earliest")
                )
                for i in range(subscribers)
            ]
            await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
            await asyncio.sleep(0.5)
            t0 = time.perf_counter()
            await asyncio.to_thread(_fill, log, topic, records)
            done, pending = await asyncio.wait(tasks, timeout=120)
            for t in pending:
                t.cancel()
            counts = [t.result() if t in done and not t.exception() else 0 for t in tasks]
            return {
                "subscribers": subscribers,
                "records": records,
                "complete": sum(1 for c in counts if c == records),
                "min_received": min(counts),
                "seconds_to_all": time.perf_counter() - t0,
            }

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--tps", type=int, default=1000)
    parser.add_argument("--writers", type=int, default=4, help="connections sharing the --tps pace")
    parser.add_argument("--subscribers", type=int, default=50)
    parser.add_argument("--fan-records", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pull-records", type=int, default=50, help="records per pull in kafka_readers")
    parser.add_argument(
        "--only",
        default="throughput,fan_out,latency,kafka_throughput,kafka_readers",
        help="comma-separated parts to run (default: all)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "consumers.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-consumers-"))
    cluster = EmbeddedPostgres(work / "pg")
    cluster.up()
    result: dict[str, Any] = {}
    try:
        dsn = cluster.dsn()
        run_migrations(dsn)
        root = work / "log"
        port = free_port()
        config = work / "t.toml"
        config.write_text(f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{root}"\n[api]\nport = {port}\n')
        parts = set(args.only.split(","))
        log = Log.open(root, writer=True)
        with _serve(config, port, work / "serve.err") as url:
            if "throughput" in parts:
                _fill(log, TOPIC, args.records)
                cat_rates: list[float] = []
                http_rates: list[float] = []
                for i in range(args.repeat):  # interleaved: both see the same neighbours
                    cat_rates.append(_cat_rate(root, args.records))
                    http_rates.append(_http_rate(url, f"tp-{i}", args.records))
                result["throughput"] = {
                    "records": args.records,
                    "log_cat_per_s": statistics.median(cat_rates),
                    "http_pull_per_s": statistics.median(http_rates),
                    "ratio_http_vs_cat": statistics.median(h / c for h, c in zip(http_rates, cat_rates, strict=True)),
                    "runs": {"log_cat": cat_rates, "http_pull": http_rates},
                }
            if "fan_out" in parts:
                fan = [_fan_out(url, log, args.subscribers, args.fan_records, i) for i in range(args.repeat)]
                result["fan_out"] = {
                    "subscribers": args.subscribers,
                    "records": args.fan_records,
                    "runs_all_complete": sum(1 for f in fan if f["complete"] == args.subscribers),
                    "seconds_to_all_median": statistics.median(f["seconds_to_all"] for f in fan),
                    "runs": fan,
                }
        log.close()
        if parts & {"kafka_throughput", "kafka_readers"}:
            result |= _kafka_throughput(dsn, work, args.records, args.repeat, parts, args.pull_records)
        if "latency" in parts:
            lat = [
                _latency(cluster, work, seconds=args.seconds, tps=args.tps, writers=args.writers, tag=str(i))
                for i in range(max(1, args.repeat - 1))
            ]
            result["latency"] = {k: statistics.median(r[k] for r in lat) for k in lat[0]}
            result["latency"]["sse_vs_log_p99"] = result["latency"]["sse_p99_ms"] / result["latency"]["log_p99_ms"]
    finally:
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)
    result["params"] = vars(args) | {"out": str(args.out)}
    text = json.dumps(result, indent=1)
    print(text)  # noqa: T201
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
