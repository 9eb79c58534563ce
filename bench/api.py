"""View API benchmark: queries/s and p99 through `tributary serve` vs the same SQL over psycopg.

A 1,000,000-row view, 4 concurrent clients on loopback; a point lookup and a 100-row page.
Prints JSON; ratios are measured in the same run (target ≥ 0.5× direct).

    .venv/bin/python bench/api.py [--rows 1000000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from api.embedded_pg import EmbeddedPostgres  # noqa: E402

PROJECTION = """
from projections.definition import Projection, Table
PROJECTION = Projection(
    name="bench_view", version=1, topics=("bench.none",),
    table=Table.of({"id": "bigint", "grp": "integer", "val": "numeric(12,2)", "note": "text"}, ["id"]),
    build=lambda df: df,
)
"""


def _clients(n: int, seconds: float, call: Callable[[int, random.Random], None]) -> dict[str, float]:
    latencies: list[list[float]] = [[] for _ in range(n)]
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        rng = random.Random(i)
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            call(i, rng)
            latencies[i].append(time.perf_counter() - t0)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = sorted(x for xs in latencies for x in xs)
    return {
        "qps": len(flat) / seconds,
        "p50_ms": flat[len(flat) // 2] * 1e3,
        "p99_ms": flat[int(len(flat) * 0.99)] * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "api.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-"))
    cluster = EmbeddedPostgres(work / "pg")
    cluster.up()
    dsn = cluster.dsn()
    server = None
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA IF NOT EXISTS views")
            conn.execute(
                "CREATE TABLE views.bench_view (id bigint PRIMARY KEY, grp integer, val numeric(12,2), note text)"
            )
            conn.execute(
                "INSERT INTO views.bench_view SELECT g, g %% 10000, g * 0.01, md5(g::text) FROM generate_series(1, %s) g",
                (args.rows,),
            )
            conn.execute("CREATE INDEX ON views.bench_view (grp, id)")
            conn.execute("VACUUM ANALYZE views.bench_view")
        (work / "bench_view.py").write_text(PROJECTION)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = work / "bench.toml"
        config.write_text(
            f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{work / "log"}"\n'
            f'[projections]\nmodules = ["{work / "bench_view.py"}"]\n[api]\nport = {port}\n'
        )
        server = subprocess.Popen(
            [sys.executable, "-c", "from api.cli import main; main()", "serve", "--config", str(config)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(base + "/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        http = [httpx.Client(base_url=base, timeout=30) for _ in range(args.clients)]
        pg = [psycopg.connect(dsn, autocommit=True) for _ in range(args.clients)]
        rows = args.rows

        def http_point(i: int, rng: random.Random) -> None:
            r = http[i].get("/views/bench_view", params={"id": rng.randint(1, rows)})
            assert r.status_code == 200 and len(r.json()["rows"]) == 1

        def pg_point(i: int, rng: random.Random) -> None:
            assert (
                pg[i]
                .execute("SELECT id, grp, val, note FROM views.bench_view WHERE id = %s", (rng.randint(1, rows),))
                .fetchall()
            )

        def http_page(i: int, rng: random.Random) -> None:
            r = http[i].get("/views/bench_view", params={"grp": rng.randint(0, 9999), "limit": 100})
            assert r.status_code == 200 and r.json()["rows"]

        def pg_page(i: int, rng: random.Random) -> None:
            assert (
                pg[i]
                .execute(
                    "SELECT id, grp, val, note FROM views.bench_view WHERE grp = %s ORDER BY id LIMIT 101",
                    (rng.randint(0, 9999),),
                )
                .fetchall()
            )

        results: dict[str, list[dict[str, float]]] = {}
        for _ in range(3):  # interleaved rounds; medians reported
            for name, fn in (
                ("direct_point", pg_point),
                ("api_point", http_point),
                ("direct_page100", pg_page),
                ("api_page100", http_page),
            ):
                results.setdefault(name, []).append(_clients(args.clients, args.seconds / 3, fn))
        med = {k: {m: round(statistics.median(r[m] for r in v), 2) for m in v[0]} for k, v in results.items()}
        out = {
            "rows": rows,
            "clients": args.clients,
            "median": med,
            "ratio_point": round(med["api_point"]["qps"] / med["direct_point"]["qps"], 3),
            "ratio_page100": round(med["api_page100"]["qps"] / med["direct_page100"]["qps"], 3),
            "target_ratio": 0.5,
        }
        for c in http:
            c.close()
        for c in pg:
            c.close()
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
