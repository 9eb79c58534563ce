"""Capture into Kafka (librdkafka's mock cluster) against capture into the local log, same run.

Prints one JSON document:
- throughput: changes/s of each backend draining the same backlog (both slots exist before it
  is written), alternating which goes first, their medians and the ratio kafka/local;
- latency: commit -> visible, p50 and p99, of each backend while a paced writer commits
  `--tps` one-row transactions a second for `--latency-seconds` (each row carries its commit
  clock): on Kafka a read_committed consumer sees it, on the local log a reader of the files
  (polling every millisecond); medians over the repeats and the ratios kafka/local.
For information only: the mock cluster lives in one process on this machine and is no
performance reference for a real Kafka.

    .venv/bin/python bench/kafka_capture.py --rows 50000 --repeat 3 --tps 200 --latency-seconds 8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._compiled import add_allow_python, require_compiled  # noqa: E402
from bench._paced import paced_writes  # noqa: E402
from tributary.api.devdb.embedded import EmbeddedPostgres  # noqa: E402
from tributary.capture.status import read_status  # noqa: E402
from tributary.log.kafka.options import OFFSETS_TOPIC  # noqa: E402
from tributary.log.local import Log  # noqa: E402

_CLI = "from tributary.api.cli.main import main; main()"
IDLE_S = 1.0  # `--until-idle`: subtracted from each run's wall time


def _config(path: Path, dsn: str, log_root: Path, slot: str, kafka: str | None) -> Path:
    backend = (
        f'backend = "kafka"\n\n[log.kafka]\nbootstrap_servers = "{kafka}"\npartitions = 4\nreplication_factor = 1\n'
        'create_topics = false\nclient = { "log_level" = "3" }\n'
        if kafka
        else ""
    )
    path.write_text(
        f'[log]\nroot = "{log_root}"\npartitions = 4\n{backend}\n[capture]\ncapture_eventstore = false\n\n'
        f'[[sources]]\nname = "b"\ndsn = "{dsn}"\nslot = "{slot}"\ninclude = ["public.bench"]\n'
    )
    return path


def _capture(config: Path) -> float:
    """Seconds `capture --until-idle` took to drain, its idle wait excluded."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _CLI, "capture", "--config", str(config), "--until-idle", str(IDLE_S)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise SystemExit(f"capture failed: {done.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - started - IDLE_S


def _latency_config(path: Path, dsn: str, log_root: Path, source: str, kafka: str | None) -> Path:
    """A capture of `public.lat` only, from a slot made just before (no snapshot)."""
    backend = (
        f'backend = "kafka"\n\n[log.kafka]\nbootstrap_servers = "{kafka}"\npartitions = 4\nreplication_factor = 1\n'
        'create_topics = false\nclient = { "log_level" = "3" }\n'
        if kafka
        else ""
    )
    path.write_text(
        f'[log]\nroot = "{log_root}"\npartitions = 4\n{backend}\n[capture]\ncapture_eventstore = false\n\n'
        f'[[sources]]\nname = "{source}"\ndsn = "{dsn}"\nslot = "{source}"\ninclude = ["public.lat"]\n'
        'snapshot = "never"\n'
    )
    return path


def _follow_local(log_root: Path, topic: str, stop: threading.Event, seen: Callable[[bytes], None]) -> None:
    """Read the local log's committed records as they come (a reader of the files)."""
    offsets: dict[int, int] = {}
    while not stop.is_set():
        try:
            with Log.open(log_root) as log:
                if topic in log.topics():
                    for p in range(log.topics()[topic].partitions):
                        for rec in log.read(topic, p, offsets.get(p, 0)):
                            offsets[p] = rec.offset + 1
                            if rec.value:
                                seen(rec.value)
        except Exception:  # noqa: BLE001 - keep following while the log is being created
            pass
        time.sleep(0.001)


def _follow_kafka(bootstraps: str, topic: str, stop: threading.Event, seen: Callable[[bytes], None]) -> None:
    """A read_committed consumer of `topic`, from its start."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstraps,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
            "log_level": "3",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(4)])
        while not stop.is_set():
            msg = consumer.poll(0.05)
            if msg is not None and msg.error() is None and msg.value():
                seen(msg.value())
    finally:
        consumer.close()


def _latency_run(
    dsn: str, work: Path, name: str, turn: int, seconds: float, tps: int, bootstraps: str | None
) -> dict[str, float]:
    """One backend's commit -> visible latency (ms) at `tps` one-row transactions a second."""
    source = f"lat_{name}_{turn}"
    topic = f"{source}.public.lat"
    log_root = work / f"log-{source}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (source,))
    config = _latency_config(work / f"{source}.toml", dsn, log_root, source, bootstraps)
    latencies: dict[int, float] = {}

    def seen(value: bytes) -> None:
        after = orjson.loads(value).get("after")
        if after and after.get("run") == turn and "sent" in after:
            latencies.setdefault(after["id"], time.time() - float(after["sent"]))

    stop = threading.Event()
    follow = (
        (lambda: _follow_kafka(bootstraps, topic, stop, seen))
        if bootstraps
        else (lambda: _follow_local(log_root, topic, stop, seen))
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI, "capture", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    reader = threading.Thread(target=follow)
    try:
        deadline = time.monotonic() + 60
        while not any(s.get("state") == "streaming" for s in (read_status(log_root) or {}).get("sources", [])):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"capture ({name}) did not start streaming")
            time.sleep(0.1)
        reader.start()
        time.sleep(2)  # the reader connected and at the topic's end before the first write
        sent = paced_writes(
            dsn,
            "INSERT INTO lat (run, sent) VALUES (%s, extract(epoch from clock_timestamp()))",
            seconds,
            tps,
            lambda _n: (turn,),
        )
        time.sleep(2)
    finally:
        stop.set()
        if reader.is_alive():
            reader.join()
        proc.terminate()
        proc.wait(timeout=60)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (source,))
        shutil.rmtree(log_root, ignore_errors=True)
    lat = sorted(v * 1000 for v in latencies.values())
    if len(lat) < sent:
        raise SystemExit(f"{name}: {sent} rows sent, {len(lat)} seen")
    return {"p50_ms": round(lat[len(lat) // 2], 2), "p99_ms": round(lat[int(len(lat) * 0.99)], 2), "sent": sent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tps", type=int, default=200, help="the latency writer's transactions per second")
    parser.add_argument("--latency-seconds", type=float, default=8.0)
    add_allow_python(parser)
    args = parser.parse_args()
    impl = require_compiled(args.allow_python)
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-kafka-"))
    cluster = EmbeddedPostgres(work / "pg")
    cluster.up()
    dsn = cluster.dsn()
    mock = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "kafka_mock.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    runs: list[dict[str, float]] = []
    latency: list[dict[str, float]] = []
    try:
        assert mock.stdin is not None and mock.stdout is not None
        bootstraps = mock.stdout.readline().strip()
        for topic, partitions in ((OFFSETS_TOPIC, 1), ("b.public.bench", 4)):
            mock.stdin.write(f"create {topic} {partitions} 1\n")
            mock.stdin.flush()
            assert mock.stdout.readline().strip() == "ok"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE bench (id bigint PRIMARY KEY, note text, n numeric)")
        configs = {
            "local": _config(work / "local.toml", dsn, work / "log-local", "bench_local", None),
            "kafka": _config(work / "kafka.toml", dsn, work / "log-kafka", "bench_kafka", bootstraps),
        }
        for config in configs.values():
            _capture(config)  # the slot (an empty snapshot)
        for turn in range(args.repeat):
            with psycopg.connect(dsn, autocommit=True) as conn:
                base = turn * args.rows
                for start in range(0, args.rows, 100):  # transactions of 100 rows
                    conn.execute(
                        "INSERT INTO bench SELECT g, 'note ' || g, g * 1.5 FROM generate_series(%s::bigint, %s::bigint) g",
                        (base + start + 1, base + min(start + 100, args.rows)),
                    )
            order = list(configs) if turn % 2 == 0 else list(reversed(configs))
            run = {f"{name}_changes_per_s": round(args.rows / _capture(configs[name]), 1) for name in order}
            run["ratio"] = round(run["kafka_changes_per_s"] / run["local_changes_per_s"], 3)
            runs.append(run)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE lat (id bigserial PRIMARY KEY, run int, sent double precision)")
        for turn in range(args.repeat):
            mock.stdin.write(f"create lat_kafka_{turn}.public.lat 4 1\n")
            mock.stdin.flush()
            assert mock.stdout.readline().strip() == "ok"
            names = ["local", "kafka"] if turn % 2 == 0 else ["kafka", "local"]
            one: dict[str, float] = {}
            for name in names:
                got = _latency_run(
                    dsn, work, name, turn, args.latency_seconds, args.tps, bootstraps if name == "kafka" else None
                )
                one.update({f"{name}_{k}": v for k, v in got.items()})
            one["p50_ratio"] = round(one["kafka_p50_ms"] / one["local_p50_ms"], 3)
            one["p99_ratio"] = round(one["kafka_p99_ms"] / one["local_p99_ms"], 3)
            latency.append(one)
    finally:
        mock.kill()
        mock.wait()
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "impl": impl,
        "rows_per_run": args.rows,
        "runs": runs,
        "median": {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]},
        "latency": {
            "tps": args.tps,
            "seconds": args.latency_seconds,
            "runs": latency,
            "median": {k: round(statistics.median(r[k] for r in latency), 3) for k in latency[0]},
            "note": "commit clock (the row's clock_timestamp()) to seen by a read_committed consumer "
            "(fetch.wait.max.ms=10) / a reader of the local log's files polling every 1 ms",
        },
        "machine": {"cpus": os.cpu_count()},
        "load_average": os.getloadavg(),
        "note": "the Kafka side is librdkafka's in-process mock cluster: for information, not a reference",
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
