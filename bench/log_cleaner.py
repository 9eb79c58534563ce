"""Capture latency with the background cleaner on vs off, in the same run (embedded Postgres).

A steady stream of updates to a few hot keys (each row carries its commit clock); the capture daemon
runs with small segments so the cleaner has work all the time. Reports commit → visible-in-the-log
latency (p50/p99/max) with `[log] cleaner_interval_s` = 0 (off) and > 0 (on), how long each
background compaction step took, and how many records were left on disk.

    .venv/bin/python bench/log_cleaner.py [--seconds 20] [--tps 1000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._compiled import add_allow_python, require_compiled  # noqa: E402
from bench._paced import paced_writes  # noqa: E402
from tributary.api.devdb.embedded import EmbeddedPostgres  # noqa: E402
from tributary.log.local import Log  # noqa: E402

TOPIC = "b.public.hot"
_STEP = re.compile(r"compacted \S+: (\d+) → (\d+) records, \d+ → \d+ bytes in ([0-9.]+)s")


def _run(
    dsn: str, work: Path, *, cleaner_s: float, seconds: float, tps: int, keys: int, segment_bytes: int, tag: str
) -> dict[str, float]:
    slot = f"bench_clean_{tag}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS hot")
        conn.execute("CREATE TABLE hot (id int PRIMARY KEY, sent double precision, pad text)")
        conn.execute("INSERT INTO hot SELECT g, 0, repeat('x', 300) FROM generate_series(1, %s) g", (keys,))
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (slot,))
    root = work / f"log-{tag}"
    config = work / f"{tag}.toml"
    config.write_text(
        f'[log]\nroot = "{root}"\npartitions = 4\nsegment_bytes = {segment_bytes}\ncleaner_interval_s = {cleaner_s}\n'
        f"[capture]\ncapture_eventstore = false\n"
        f'[[sources]]\nname = "b"\ndsn = "{dsn}"\nslot = "{slot}"\ninclude = ["public.hot"]\nsnapshot = "never"\n'
    )
    err = (work / f"{tag}.err").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from tributary.api.cli.main import main; main()", "capture", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=err,
    )
    time.sleep(3)
    latencies: list[float] = []
    stop = threading.Event()

    def follow() -> None:
        nxt: dict[int, int] = {}
        while not stop.is_set():
            try:
                with Log.open(root) as log:
                    if TOPIC in log.topics():
                        for p in range(log.topics()[TOPIC].partitions):
                            for rec in log.read(TOPIC, p, nxt.get(p, 0)):
                                nxt[p] = rec.offset + 1
                                after = json.loads(rec.value).get("after") if rec.value else None
                                if after and after.get("sent"):
                                    latencies.append(time.time() - float(after["sent"]))
            except FileNotFoundError:
                pass  # the log is being created
            time.sleep(0.001)

    reader = threading.Thread(target=follow)
    reader.start()
    sent = paced_writes(
        dsn,
        "UPDATE hot SET sent = extract(epoch from clock_timestamp()) WHERE id = %s",
        seconds,
        tps,
        lambda n: (n % keys + 1,),
    )
    time.sleep(2)
    stop.set()
    reader.join()
    proc.terminate()
    proc.wait(timeout=60)
    err.seek(0)
    steps = [(int(a), int(b), float(s)) for a, b, s in _STEP.findall(err.read())]
    err.close()
    left = sum(f.read_bytes().count(b"\n") for f in (root / TOPIC).rglob("*.log"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    shutil.rmtree(root, ignore_errors=True)
    lat = sorted(v * 1000 for v in latencies)
    secs = sorted(s for _, _, s in steps)
    return {
        "sent": sent,
        "seen": len(lat),
        "p50_ms": lat[len(lat) // 2],
        "p99_ms": lat[int(len(lat) * 0.99)],
        "max_ms": lat[-1],
        "compactions": len(steps),
        "step_p50_ms": secs[len(secs) // 2] * 1000 if secs else 0.0,
        "step_max_ms": secs[-1] * 1000 if secs else 0.0,
        "records_left_on_disk": left,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--tps", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--cleaner-interval", type=float, default=1.0)
    parser.add_argument("--segment-bytes", type=int, default=131072)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "log_cleaner.json")
    add_allow_python(parser)
    args = parser.parse_args()
    impl = require_compiled(args.allow_python)
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-cleaner-"))
    cluster = EmbeddedPostgres(work / "pg")
    cluster.up()
    runs: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    try:
        for i in range(args.repeat):  # interleaved, so both see the same neighbours
            for mode, interval in (("off", 0.0), ("on", args.cleaner_interval)):
                runs[mode].append(
                    _run(
                        cluster.dsn(),
                        work,
                        cleaner_s=interval,
                        seconds=args.seconds,
                        tps=args.tps,
                        keys=args.keys,
                        segment_bytes=args.segment_bytes,
                        tag=f"{mode}{i}",
                    )
                )
    finally:
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)
    result = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in runs.items() if rs}
    result["on_vs_off_p99"] = result["on"]["p99_ms"] / result["off"]["p99_ms"]
    result["params"] = vars(args) | {"out": str(args.out)}
    result["impl"] = impl
    text = json.dumps(result, indent=1)
    print(text)  # noqa: T201
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
