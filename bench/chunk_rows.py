"""Chunked snapshot rate by `snapshot_chunk_rows`, against the consistent snapshot, same run.

Prints one JSON document: per method, the median seconds of `repeat` snapshots of one table (the
same table each time, methods alternating) and the ratio consistent/chunked (1.0 = as fast).

    .venv/bin/python bench/chunk_rows.py --rows 500000 --chunks 5000,20000,50000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._compiled import add_allow_python, require_compiled  # noqa: E402
from tributary.api.devdb.embedded import EmbeddedPostgres  # noqa: E402
from tributary.capture.daemon import CaptureDaemon, DaemonOptions  # noqa: E402
from tributary.capture.spec import SourceSpec  # noqa: E402

IDLE_S = 0.3  # `until_idle_s`: the same for every run


def _once(dsn: str, root: Path, method: str, chunk_rows: int) -> float:
    spec = SourceSpec(
        name="b",
        dsn=dsn,
        slot="bench_chunk",
        include=("public.snap_t",),
        exclude=(),
        snapshot="initial",
        partitions=4,
        snapshot_method=method,
        snapshot_chunk_rows=chunk_rows,
    )
    started = time.perf_counter()
    CaptureDaemon([spec], DaemonOptions(log_root=root, until_idle_s=IDLE_S)).run()
    took = time.perf_counter() - started - IDLE_S
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('bench_chunk')")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--chunks", default="5000,20000,50000")
    parser.add_argument("--repeat", type=int, default=3)
    add_allow_python(parser)
    args = parser.parse_args()
    impl = require_compiled(args.allow_python)
    chunks = [int(c) for c in args.chunks.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-chunk-") as tmp:
        work = Path(tmp)
        cluster = EmbeddedPostgres(work / "pg")
        cluster.up()
        try:
            dsn = cluster.dsn()
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE TABLE snap_t (id bigserial PRIMARY KEY, a int, b text, c timestamptz)")
                conn.execute(
                    "INSERT INTO snap_t (a, b, c) SELECT g, md5(g::text) || md5((g+1)::text), now()"
                    " FROM generate_series(1, %s) g",
                    (args.rows,),
                )
                conn.execute("VACUUM ANALYZE snap_t")
            methods = [("consistent", 0)] + [("chunked", c) for c in chunks]
            times: dict[str, list[float]] = {}
            for turn in range(args.repeat):
                order = methods if turn % 2 == 0 else methods[::-1]
                for method, rows in order:
                    name = method if method == "consistent" else f"chunked_{rows}"
                    root = work / f"log-{name}-{turn}"
                    times.setdefault(name, []).append(_once(dsn, root, method, rows or 20_000))
        finally:
            cluster.down()
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    base = medians["consistent"]
    out = {
        "impl": impl,
        "rows": args.rows,
        "repeat": args.repeat,
        "median_s": medians,
        "rows_per_s": {name: args.rows / s for name, s in medians.items()},
        "ratio_vs_consistent": {name: base / s for name, s in medians.items() if name != "consistent"},
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
