"""Capture into Kafka (librdkafka's mock cluster) against capture into the local log, same run.

Prints one JSON document: changes/s of each backend draining the same backlog (both slots exist
before it is written), alternating which goes first, their medians and the ratio kafka/local.
For information only: the mock cluster lives in one process on this machine and is no
performance reference for a real Kafka.

    .venv/bin/python bench/kafka_capture.py --rows 50000 --repeat 3
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
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tributary.api.devdb.embedded import EmbeddedPostgres  # noqa: E402
from tributary.capture.kafka_log import OFFSETS_TOPIC  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
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
    finally:
        mock.kill()
        mock.wait()
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "rows_per_run": args.rows,
        "runs": runs,
        "median": {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]},
        "machine": {"cpus": os.cpu_count()},
        "load_average": os.getloadavg(),
        "note": "the Kafka side is librdkafka's in-process mock cluster: for information, not a reference",
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
