"""Benchmark: log append with group commit vs plain buffered writes + one fsync per batch.

Prints JSON (and saves it to bench/results/log_append.json): records/s and MB/s for appending
N records of ~500 bytes over 4 partitions, committing every 1 ms of linger or 1,000 records,
against a baseline measured in the same run (the same encoded bytes, buffered writes, one fsync
per 1,000 records); plus sequential reads through `Log.read` vs reading the raw files, and the
pipelined append again while a second topic owner (another process, e.g. an emitting projection)
appends and commits on the same root. Each figure is the median of --repeat runs.

    python bench/log_append.py [--records N] [--repeat 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._compiled import add_allow_python, require_compiled  # noqa: E402
from tributary.log.local import GroupCommitter, Log, TopicConfig, canonical_json, partition_for  # noqa: E402
from tributary.log.local.codec import encode_batch  # noqa: E402

PARTITIONS = 4
BATCH = 1000
LINGER_MS = 1.0
# pending records at which the writer waits for the in-flight commit instead of appending on
BACKPRESSURE = 16 * BATCH

Rec = tuple[bytes | None, bytes | None, int, bytes | None]


def make_records(n: int, chunk: int = 100) -> tuple[list[list[Rec]], list[list[int]]]:
    """Chunks of ~500-byte records (key, value, ts, headers) and each record's partition."""
    filler = "x" * 250
    values = [
        canonical_json(
            {
                "op": "u",
                "after": {"id": i, "name": f"customer {i}", "note": filler},
                "source": {"lsn": f"0/{i:X}", "table": "customers"},
                "ts_ms": 1_700_000_000_000,
            }
        )
        for i in range(1000)
    ]
    chunks: list[list[Rec]] = []
    parts: list[list[int]] = []
    for start in range(0, n, chunk):
        recs: list[Rec] = []
        ps: list[int] = []
        for i in range(start, min(n, start + chunk)):
            key = canonical_json({"id": i % 100_000})
            recs.append((key, values[i % 1000], 1_700_000_000_000 + i, None))
            ps.append(partition_for(key, PARTITIONS))
        chunks.append(recs)
        parts.append(ps)
    return chunks, parts


def second_owner(root: Path, stop: MpEvent, commits: Synchronized[int], pause_s: float) -> None:
    """Another owner of the root (its own lock and manifest) appending 100 records and committing,
    over and over (`pause_s` apart; 0: flat out, the worst case) until `stop`: what a projection
    emitting a derived stream does."""
    with Log.open(root, writer=True, owner="bench.second") as log:
        log.create_topic("second", TopicConfig(partitions=PARTITIONS))
        value = canonical_json({"op": "c", "after": {"note": "y" * 400}})
        i = 0
        while not stop.is_set():
            recs = [(canonical_json({"id": i + k}), value, 1_700_000_000_000, None) for k in range(100)]
            log.append("second", i % PARTITIONS, recs)
            log.commit(positions={"bench.second": str(i)})
            i += 100
            commits.value += 1
            stop.wait(pause_s)


def run_log(
    base: Path,
    chunks: list[list[Rec]],
    parts: list[list[int]],
    pipelined: bool,
    fsync: bool = True,
    alongside: bool = False,
    pause_s: float = 0.0,
    apart: bool = False,
) -> tuple[float, int, int]:
    root = base / "log"
    shutil.rmtree(root, ignore_errors=True)
    log = Log.open(root, writer=True, fsync=fsync)
    log.create_topic("bench", TopicConfig(partitions=PARTITIONS))
    if alongside:
        ctx = multiprocessing.get_context("spawn")  # a process of its own, not a copy of this one's heap
        stop = ctx.Event()
        done = ctx.Value("i", 0)
        other = ctx.Process(target=second_owner, args=(base / "apart" if apart else root, stop, done, pause_s))
        other.start()
        while done.value == 0 and other.is_alive():  # it runs before we measure
            time.sleep(0.01)
    gc = GroupCommitter(linger_ms=LINGER_MS, max_records=BATCH)
    clock = time.perf_counter
    inflight: Future[None] | None = None
    commits = 0
    t0 = clock()
    for chunk, ps in zip(chunks, parts, strict=True):
        by_p: list[list[Rec]] = [[] for _ in range(PARTITIONS)]
        for rec, p in zip(chunk, ps, strict=True):
            by_p[p].append(rec)
        for p, recs in enumerate(by_p):
            if recs:
                log.append("bench", p, recs)
        now = clock() * 1000
        gc.record_appended(len(chunk), now)
        if gc.due(now):
            if not pipelined:
                log.commit()
                gc.committed(now)
                commits += 1
            elif inflight is None or inflight.done() or gc.pending >= BACKPRESSURE:
                # group commit: one commit in flight; what arrives meanwhile joins the next one
                if inflight is not None:
                    inflight.result()
                inflight = log.commit_async()
                gc.committed(now)
                commits += 1
    if inflight is not None:
        inflight.result()
    log.commit()
    elapsed = clock() - t0
    size = sum(f.stat().st_size for f in (root / "bench").rglob("*.log"))
    log.close()
    if alongside:
        stop.set()
        other.join()
        assert other.exitcode == 0, "the second owner failed"
        return elapsed, size, done.value  # the second owner's commits meanwhile
    return elapsed, size, commits + 1


def encode_only(chunks: list[list[Rec]]) -> float:
    t0 = time.perf_counter()
    for chunk in chunks:
        encode_batch(0, chunk)
    return time.perf_counter() - t0


def run_baseline(base: Path, data: list[bytes]) -> float:
    """The same encoded bytes: buffered writes, one fsync per batch of 1,000 records."""
    path = base / "baseline.log"
    path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for batch in data:
            f.write(batch)
            f.flush()
            os.fsync(f.fileno())
    return time.perf_counter() - t0


def read_log(base: Path) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = 0
    with Log.open(base / "log") as log:
        for p in range(PARTITIONS):
            for _rec in log.read("bench", p):
                n += 1
    return time.perf_counter() - t0, n


def read_raw(base: Path) -> float:
    t0 = time.perf_counter()
    for f in sorted((base / "log" / "bench").rglob("*.log")):
        with open(f, "rb", buffering=0) as fh:
            while fh.read(1 << 20):
                pass
    return time.perf_counter() - t0


def median(fn: Callable[[], float], repeat: int) -> float:
    return statistics.median(fn() for _ in range(repeat))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=100, help="records per step (a capture poll)")
    ap.add_argument(
        "--second-pause-ms", type=float, default=0.0, help="pause between the second owner's commits (0: flat out)"
    )
    ap.add_argument(
        "--second-apart", action="store_true", help="the second writer on a log root of its own (same disk)"
    )
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "log_append.json")
    add_allow_python(ap)
    args = ap.parse_args()
    impl = require_compiled(args.allow_python)
    base = Path(tempfile.mkdtemp(prefix="log-bench-", dir=args.dir))
    try:
        chunks, parts = make_records(args.records, args.chunk)
        flat = [r for c in chunks for r in c]
        encoded, _sizes, _ts = encode_batch(0, flat)
        lines = encoded.splitlines(keepends=True)
        baseline_data = [b"".join(lines[i : i + BATCH]) for i in range(0, len(lines), BATCH)]
        nbytes = len(encoded)
        n = args.records
        del flat, encoded, lines

        # interleaved, each phase starting with no dirty pages left by the previous one
        base_times: list[float] = []
        pipe_runs: list[tuple[float, int, int]] = []
        sync_runs: list[tuple[float, int, int]] = []
        cpu_runs: list[tuple[float, int, int]] = []
        enc_times: list[float] = []
        shared_runs: list[tuple[float, int, int]] = []
        for _ in range(args.repeat):
            os.sync()
            base_times.append(run_baseline(base, baseline_data))
            os.sync()
            pipe_runs.append(run_log(base, chunks, parts, pipelined=True))
            os.sync()
            sync_runs.append(run_log(base, chunks, parts, pipelined=False))
            os.sync()
            cpu_runs.append(run_log(base, chunks, parts, pipelined=True, fsync=False))
            os.sync()
            shared_runs.append(
                run_log(
                    base,
                    chunks,
                    parts,
                    pipelined=True,
                    alongside=True,
                    pause_s=args.second_pause_ms / 1000,
                    apart=args.second_apart,
                )
            )
            enc_times.append(encode_only(chunks))
        t_base = statistics.median(base_times)
        t_sync = statistics.median(t for t, _, _ in sync_runs)
        t_pipe = statistics.median(t for t, _, _ in pipe_runs)
        t_cpu = statistics.median(t for t, _, _ in cpu_runs)
        t_encode = statistics.median(enc_times)
        t_shared = statistics.median(t for t, _, _ in shared_runs)
        log_bytes = pipe_runs[-1][1]
        os.sync()
        read_runs = [read_log(base) for _ in range(args.repeat)]
        t_read = statistics.median(t for t, _ in read_runs)
        assert all(c == n for _, c in read_runs), "read back a different number of records"
        t_raw = median(lambda: read_raw(base), args.repeat)
        mb = 1 << 20
        result = {
            "impl": impl,
            "records": n,
            "record_bytes_avg": round(nbytes / n, 1),
            "partitions": PARTITIONS,
            "group_commit": {"linger_ms": LINGER_MS, "max_records": BATCH, "chunk": args.chunk},
            "append_pipelined": {
                "records_per_s": round(n / t_pipe),
                "mb_per_s": round(log_bytes / mb / t_pipe, 1),
                "seconds": round(t_pipe, 3),
                "commits": statistics.median(c for _, _, c in pipe_runs),
                "records_per_commit": round(n / statistics.median(c for _, _, c in pipe_runs)),
            },
            "append_sync_commit": {
                "records_per_s": round(n / t_sync),
                "mb_per_s": round(log_bytes / mb / t_sync, 1),
                "seconds": round(t_sync, 3),
                "commits": statistics.median(c for _, _, c in sync_runs),
            },
            "append_pipelined_without_fsync": {
                "records_per_s": round(n / t_cpu),
                "seconds": round(t_cpu, 3),
                "note": "CPU floor of the append path (Log.open(fsync=False))",
            },
            "append_pipelined_with_second_owner": {
                "records_per_s": round(n / t_shared),
                "seconds": round(t_shared, 3),
                "second_owner_commits": statistics.median(c for _, _, c in shared_runs),
                "second_owner_pause_ms": args.second_pause_ms,
                "second_owner_root": "its own" if args.second_apart else "the same",
                "ratio_vs_alone": round(t_pipe / t_shared, 3),
                "ratio_vs_alone_per_repeat": [
                    round(p[0] / x[0], 3) for p, x in zip(pipe_runs, shared_runs, strict=True)
                ],
                "note": "the same appends while another owner (a process) commits 100 records at a time on the root",
            },
            "encode_only": {"records_per_s": round(n / t_encode), "seconds": round(t_encode, 3)},
            "baseline_fsync_per_1000": {
                "records_per_s": round(n / t_base),
                "mb_per_s": round(nbytes / mb / t_base, 1),
                "seconds": round(t_base, 3),
            },
            "ratio_pipelined_vs_baseline": round(t_base / t_pipe, 3),
            "ratio_sync_vs_baseline": round(t_base / t_sync, 3),
            "ratio_pipelined_vs_baseline_per_repeat": [
                round(b / p[0], 3) for b, p in zip(base_times, pipe_runs, strict=True)
            ],
            "read": {
                "records_per_s": round(n / t_read),
                "mb_per_s": round(log_bytes / mb / t_read, 1),
            },
            "read_raw_files": {"mb_per_s": round(log_bytes / mb / t_raw, 1)},
            "read_ratio_vs_raw": round(t_raw / t_read, 4),
            "repeat": args.repeat,
            "statistic": "median",
        }
        text = json.dumps(result, indent=2)
        print(text)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
