"""View API benchmark: queries/s and p50/p99 through `tributary serve` vs the same SQL over psycopg.

A 1,000,000-row view, 4 concurrent clients on loopback; a point lookup and a 100-row page.
Each client is its own process (so the load generator's GIL is not the bottleneck) holding one
keep-alive HTTP connection (a minimal raw-socket HTTP/1.1 client) and one psycopg connection; API
and direct runs alternate in rounds and medians over the rounds are reported. Prints JSON; ratios are
measured in the same run (target ≥ 0.5× direct). Each run also reports the CPU time per request of
the clients, the API server and PostgreSQL (from /proc): unlike queries/s, these barely move when
other work shares the machine, and they say where a request's cost goes.

    .venv/bin/python bench/api.py [--rows 1000000] [--seconds 10] [--clients 4] [--workers 1,2] [--http h11,httptools]
        [--compare-to ../viewcpu-base]   # another revision's server beside this one, interleaved
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tributary.api.devdb.embedded import EmbeddedPostgres  # noqa: E402

PROJECTION = """
from tributary.projections.definition import Projection, Table
PROJECTION = Projection(
    name="bench_view", version=1, topics=("bench.none",),
    table=Table.of({"id": "bigint", "grp": "integer", "val": "numeric(12,2)", "note": "text"}, ["id"]),
    build=lambda df: df,
)
"""

# The SQL the API runs for these two requests (same columns, casts, order and LIMIT n+1), so the
# direct figure is the same database work without the HTTP service in between. Both sides run it as
# a prepared statement (psycopg's automatic preparation: here after 5 runs, the API's pool after 2).
DIRECT_SQL = {
    "point": 'SELECT "id", "grp", "val", "note" FROM "views"."bench_view" '
    'WHERE "id" = CAST(%s AS bigint) ORDER BY "id" LIMIT 101',
    "page100": 'SELECT "id", "grp", "val", "note" FROM "views"."bench_view" '
    'WHERE "grp" = CAST(%s AS integer) ORDER BY "id" LIMIT 101',
}


class _Http:
    """A lean keep-alive HTTP/1.1 client: one socket, a prebuilt request, Content-Length bodies only."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connect()

    def connect(self) -> None:
        """(Re)connect: uvicorn drops keep-alive connections idle for 5 s, e.g. during a direct run."""
        self.sock = socket.create_connection(("127.0.0.1", self.port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def get(self, target: str) -> tuple[int, bytes]:
        self.sock.sendall(b"GET %s HTTP/1.1\r\nHost: bench\r\n\r\n" % target.encode())
        buf = self.buf
        while (end := buf.find(b"\r\n\r\n")) < 0:
            buf += self._recv()
        head, buf = buf[:end], buf[end + 4 :]
        status = int(head[9:12])
        # the Content-Length header found in one search (a lean client's way; the body is still
        # read to its end and parsed by the caller)
        at = head.lower().find(b"\r\ncontent-length:")
        length = 0 if at < 0 else int(head[at + 17 :].split(b"\r\n", 1)[0])
        while len(buf) < length:
            buf += self._recv()
        self.buf = buf[length:]
        return status, buf[:length]

    def _recv(self) -> bytes:
        chunk = self.sock.recv(262144)
        if not chunk:
            raise ConnectionError("server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()


def _client(index: int, ports: list[int], dsn: str, rows: int, pipe: Connection) -> None:
    """One client process: runs the requested workload until the given deadline, sends latencies back."""
    http = _Http(ports[0])
    pg = psycopg.connect(dsn, autocommit=True)
    rng = random.Random(index)

    def arg(kind: str) -> int:
        return rng.randint(1, rows) if kind == "point" else rng.randint(0, 9999)

    def api(kind: str) -> None:
        if kind == "healthz":  # HTTP + FastAPI, no database
            if http.get("/healthz")[0] != 200:
                raise AssertionError("/healthz failed")
            return
        target = (
            f"/views/bench_view?id={arg(kind)}" if kind == "point" else f"/views/bench_view?grp={arg(kind)}&limit=100"
        )
        status, body = http.get(target)
        got = orjson.loads(body)["rows"] if status == 200 else None
        if not got or (kind == "point" and len(got) != 1):
            raise AssertionError(f"{target}: {status} {body[:200]!r}")

    def direct(kind: str) -> None:
        got = pg.execute(DIRECT_SQL[kind], (arg(kind),)).fetchall()
        if not got or (kind == "point" and len(got) != 1):
            raise AssertionError(f"direct {kind}: {got!r}")

    try:
        while (job := pipe.recv()) is not None:
            side, kind, port, start, stop = job
            call = api if side == "api" else direct
            if side == "api":
                http.close()
                http.port = port
                http.connect()
            for _ in range(20):  # warm up (prepared statements, caches) before the clock starts
                call(kind)
            lat = array("d")
            while time.monotonic() < start:
                time.sleep(0.0005)
            cpu = time.process_time()
            while (t0 := time.monotonic()) < stop:
                call(kind)
                lat.append(time.monotonic() - t0)
            pipe.send_bytes(lat.tobytes())
            pipe.send(time.process_time() - cpu)
    finally:
        http.close()
        pg.close()


def _cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes and their children (uvicorn workers, PostgreSQL backends)."""
    total = 0
    for pid in pids:
        try:
            children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            children = []
        for p in [pid, *children]:
            try:
                fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # exited meanwhile
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _run(
    pipes: list[Connection], side: str, kind: str, seconds: float, port: int = 0, *, server: int, postgres: int
) -> dict[str, float]:
    """One measured run; with the CPU time each party spent per request: the clients, the API server
    (all its workers) and PostgreSQL (every backend), read from /proc at the start and the end."""
    start = time.monotonic() + 0.3
    for p in pipes:
        p.send((side, kind, port, start, start + seconds))
    time.sleep(max(0.0, start - time.monotonic()))
    server_cpu, pg_cpu = _cpu_seconds([server]) if side == "api" else 0.0, _cpu_seconds([postgres])
    time.sleep(max(0.0, start + seconds - time.monotonic()))
    server_cpu = _cpu_seconds([server]) - server_cpu if side == "api" else 0.0
    pg_cpu = _cpu_seconds([postgres]) - pg_cpu
    flat: list[float] = []
    client_cpu = 0.0
    for p in pipes:
        lat = array("d")
        lat.frombytes(p.recv_bytes())
        flat.extend(lat)
        client_cpu += p.recv()
    flat.sort()
    n = len(flat)
    return {
        "qps": n / seconds,
        "p50_ms": flat[n // 2] * 1e3,
        "p99_ms": flat[int(n * 0.99)] * 1e3,
        "cpu_us_client": client_cpu / n * 1e6,
        "cpu_us_server": server_cpu / n * 1e6,
        "cpu_us_postgres": pg_cpu / n * 1e6,
    }


def _load(dsn: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS views")
        conn.execute("CREATE TABLE views.bench_view (id bigint PRIMARY KEY, grp integer, val numeric(12,2), note text)")
        conn.execute(
            "INSERT INTO views.bench_view SELECT g, g %% 10000, g * 0.01, md5(g::text) FROM generate_series(1, %s) g",
            (rows,),
        )
        conn.execute("CREATE INDEX ON views.bench_view (grp, id)")
        conn.execute("VACUUM ANALYZE views.bench_view")


# The top-level folders as the package they install as (pyproject's `package-dir`), for `--compare-to`.
PACKAGE_DIRS = ("api", "capture", "log", "eventstore", "projections", "migrations", "consumers", "sinks")


def _package_tree(checkout: Path, into: Path) -> Path:
    """A folder whose `tributary` package is `checkout`'s (links, as `make lint` builds for mypy): on
    PYTHONPATH it comes before the editable install of this worktree (a finder after the path's)."""
    root = into / "tributary"
    root.mkdir(parents=True)
    for f in (checkout / "tributary").iterdir():
        if f.name != "__pycache__":
            (root / f.name).symlink_to(f)
    for d in PACKAGE_DIRS:
        (root / d).symlink_to(checkout / d)
    return into


def _serve(
    work: Path, dsn: str, workers: int, http: str, tree: Path | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """`tributary serve` on a free port, healthy; of the package in `tree` (`_package_tree`) when given."""
    (work / "bench_view.py").write_text(PROJECTION)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = work / f"bench-{port}.toml"
    config.write_text(
        f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{work / "log"}"\n'
        f'[projections]\nmodules = ["{work / "bench_view.py"}"]\n[api]\nport = {port}\nhttp = "{http}"\n'
    )
    cmd = [sys.executable, "-c", "from tributary.api.cli.main import main; main()", "serve", "--config", str(config)]
    if workers != 1:
        cmd += ["--workers", str(workers)]
    env = {**os.environ, "PYTHONPATH": str(tree)} if tree is not None else None
    err = work / f"serve-{port}.err"
    server = subprocess.Popen(cmd, cwd=work, stdout=subprocess.DEVNULL, stderr=err.open("wb"), env=env)
    for _ in range(300):
        try:
            status, _ = _Http(port).get("/healthz")
            if status == 200:
                return server, port
        except OSError:
            pass
        if server.poll() is not None:
            raise RuntimeError("tributary serve exited:\n" + err.read_text()[-2000:])
        time.sleep(0.2)
    raise RuntimeError("tributary serve did not become healthy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the view")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per workload (over all rounds)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client processes")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument(
        "--workers",
        default="1,2",
        help="`tributary serve --workers` values, comma-separated: one server each, measured interleaved",
    )
    parser.add_argument(
        "--http",
        default="h11",
        help="`[api] http` parsers, comma-separated (h11, httptools): one server per parser and worker count",
    )
    parser.add_argument(
        "--compare-to",
        type=Path,
        help="a checkout of another revision (`git worktree add DIR main`): its servers run beside this "
        "worktree's, interleaved, labelled `base_…`",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "api.json")
    args = parser.parse_args()
    worker_counts = [int(w) for w in str(args.workers).split(",")]
    parsers = str(args.http).split(",")
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-"))
    trees: list[tuple[str, Path | None]] = [("", None)]
    if args.compare_to:
        trees.append(("base_", _package_tree(args.compare_to.resolve(), work / "base")))
    # one server per (tree, workers, parser); labelled `w1`, `w2`, `w1_httptools` beside a first parser,
    # and `base_w1` … for the checkout compared to
    variants = [
        (w, h, f"{prefix}w{w}" if h == parsers[0] else f"{prefix}w{w}_{h}", tree)
        for prefix, tree in trees
        for h in parsers
        for w in worker_counts
    ]
    cluster = EmbeddedPostgres(work / "pg")
    cluster.up()
    dsn = cluster.dsn()
    servers: list[subprocess.Popen[bytes]] = []
    procs: list[Any] = []
    pipes: list[Connection] = []
    try:
        _load(dsn, args.rows)
        ports = []
        for w, h, _, tree in variants:
            server, port = _serve(work, dsn, w, h, tree)
            servers.append(server)
            ports.append(port)
        ctx = mp.get_context("spawn")
        for i in range(args.clients):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_client, args=(i, ports, dsn, args.rows, theirs), daemon=True)
            proc.start()
            procs.append(proc)
            pipes.append(ours)
        postmaster = int((cluster.pgdata / "postmaster.pid").read_text().split()[0])
        pids = dict(zip(ports, (s.pid for s in servers), strict=True))
        results: dict[str, list[dict[str, float]]] = {}
        per_run = args.seconds / args.rounds
        runs = [("direct", "", 0)] + [
            ("api", f"_{v}", port) for (_, _, v, _), port in zip(variants, ports, strict=True)
        ]
        for r in range(args.rounds):  # interleaved; the order alternates so no side always goes first
            for kind in ("point", "page100"):
                for side, suffix, port in runs if r % 2 == 0 else runs[::-1]:
                    results.setdefault(f"{side}_{kind}{suffix}", []).append(
                        _run(pipes, side, kind, per_run, port, server=pids.get(port, 0), postgres=postmaster)
                    )
            for (_, _, v, _), port in zip(variants, ports, strict=True):  # HTTP + FastAPI routing, no database
                results.setdefault(f"api_healthz_{v}", []).append(
                    _run(pipes, "api", "healthz", per_run / 2, port, server=pids[port], postgres=postmaster)
                )
        med = {k: {m: round(statistics.median(x[m] for x in v), 2) for m in v[0]} for k, v in sorted(results.items())}
        ratios = {
            f"{kind}_{v}": round(med[f"api_{kind}_{v}"]["qps"] / med[f"direct_{kind}"]["qps"], 3)
            for _, _, v, _ in variants
            for kind in ("point", "page100")
        }

        def cpu(key: str) -> float:
            m = med[key]
            return m["cpu_us_client"] + m["cpu_us_server"] + m["cpu_us_postgres"]

        # what the ratio would be if CPU time were all that limits both sides (2 cores, no idle time)
        cpu_ratios = {
            f"{kind}_{v}": round(cpu(f"direct_{kind}") / cpu(f"api_{kind}_{v}"), 3)
            for _, _, v, _ in variants
            for kind in ("point", "page100")
        }
        out = {
            "rows": args.rows,
            "clients": args.clients,
            "client_processes": True,
            "workers": worker_counts,
            "http": parsers,
            "rounds": args.rounds,
            "seconds_per_run": round(per_run, 2),
            "median": med,
            "ratios": ratios,
            "cpu_ratios": cpu_ratios,
            # the first --workers value (the default [api] workers = 1) is the headline figure
            "compared_to": str(args.compare_to) if args.compare_to else None,
            "ratio_point": ratios[f"point_w{worker_counts[0]}"],
            "ratio_page100": ratios[f"page100_w{worker_counts[0]}"],
            "target_ratio": 0.5,
        }
    finally:
        for p in pipes:
            with contextlib.suppress(OSError):
                p.send(None)
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
        for server in servers:
            server.terminate()
            server.wait(timeout=30)
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
