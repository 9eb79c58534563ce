"""Where the API server's CPU goes, per route: `tributary serve` (one worker) under cProfile with a
CPU-time clock, profiled for a window of steady load from 3 client processes (start-up excluded),
its exclusive time grouped by layer. A deterministic profiler inflates code of many small Python
calls against C (the parser's share of h11 more than of httptools): read the shares, not µs.

    .venv/bin/python bench/api_profile.py [--rows 100000] [--http h11] [--route point|page100|healthz|command]

`command` profiles `POST /commands/account/…` (a bank deposit, each client to its own account; the
bank example served from `[eventstore] modules`), with the handler's thread profiled too.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import pstats
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

# bench/api.py (the view, its rows, the lean HTTP client), loaded by its path: a module named
# `api` would shadow the package folder of the same name.
_spec = importlib.util.spec_from_file_location("bench_api", ROOT / "bench" / "api.py")
assert _spec is not None and _spec.loader is not None
bench_api = importlib.util.module_from_spec(_spec)
sys.modules["bench_api"] = bench_api
_spec.loader.exec_module(bench_api)
_spec = importlib.util.spec_from_file_location("bench_eventstore", ROOT / "bench" / "eventstore.py")
assert _spec is not None and _spec.loader is not None
bench_eventstore = importlib.util.module_from_spec(_spec)
sys.modules["bench_eventstore"] = bench_eventstore
_spec.loader.exec_module(bench_eventstore)
from tributary.api.devdb.embedded import EmbeddedPostgres  # noqa: E402
from tributary.eventstore.migrate import run_migrations  # noqa: E402

# The server: the profiler starts on SIGUSR1 and stops on SIGUSR2; the stats are written on exit.
SERVER = """
import cProfile, signal, sys, time
from tributary.api.cli.main import main
out, sys.argv = sys.argv[2], ["tributary", "serve", "--config", sys.argv[1]]
prof = cProfile.Profile(time.thread_time)
signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
signal.signal(signal.SIGUSR2, lambda *_: prof.disable())
try:
    main()
finally:
    prof.dump_stats(out)
"""

# `--route command`: the same, plus a profiler per worker thread (the command handler runs in
# asyncio's thread pool), each started on its thread's first call after SIGUSR1 and merged on exit.
SERVER_THREADS = """
import cProfile, glob, pstats, signal, sys, threading, time
from tributary.api.cli.main import main
out, sys.argv = sys.argv[2], ["tributary", "serve", "--config", sys.argv[1]]
on, profiles, local = threading.Event(), [], threading.local()
prof = cProfile.Profile(time.thread_time)
profiles.append(prof)
def tracer(frame, event, arg):
    if on.is_set() and not hasattr(local, "prof") and threading.current_thread() is not threading.main_thread():
        local.prof = cProfile.Profile(time.thread_time)
        profiles.append(local.prof)
        local.prof.enable()
    return None
threading.setprofile(tracer)
def start(*_):
    on.set(); prof.enable()
def stop(*_):
    on.clear()
    prof.disable()
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
try:
    main()
finally:
    for i, p in enumerate(profiles):
        p.dump_stats(f"{out}.{i}")
    stats = pstats.Stats(*[f"{out}.{i}" for i in range(len(profiles))])
    stats.dump_stats(out)
"""

TARGETS = {
    "point": "/views/bench_view?id={row}",
    "page100": "/views/bench_view?grp={group}&limit=100",
    "healthz": "/healthz",
    "command": "/commands/account/{account}",
}
DEPOSIT = b'{"type": "deposit", "data": {"amount": "1.00"}}'


# Layer by the file a function is in (first match); C functions are their own line.
LAYERS = [
    ("HTTP parser and protocol (h11/httptools, uvicorn)", r"site-packages/(h11|uvicorn|httptools)/"),
    (
        "ASGI middleware (ours, Starlette's, FastAPI's)",
        r"api/http/(app|front|limits|head)\.py|starlette/middleware|starlette/_exception_handler"
        r"|fastapi/(telemetry|_body_limit|middleware)",
    ),
    ("routing (path match, route dispatch)", r"fastapi/routing\.py|starlette/routing\.py"),
    ("dependency injection, validation", r"fastapi/dependencies|pydantic|fastapi/_compat"),
    ("request and response objects", r"starlette/(requests|datastructures|responses)|fastapi/responses|urllib/parse"),
    ("route code (views, auth, state)", r"api/http/|api/settings"),
    ("pool checkout (psycopg_pool)", r"psycopg_pool/"),
    ("command handler, event store, domain (worker thread)", r"/eventstore/|sqlalchemy/"),
    ("thread pool hop (executor, its queue)", r"concurrent/futures/|/threading\.py|/queue\.py"),
    ("psycopg (query, rows)", r"psycopg/"),
    ("event loop (asyncio)", r"asyncio/|selectors|contextvars|contextlib|weakref"),
]
C_CALLS = "C calls (orjson, socket writes, dict and str methods)"


def _client(port: int, target: str, rows: int, seconds: float) -> None:
    """One client process: requests one after another on a keep-alive connection."""
    http, rng = bench_api._Http(port), random.Random()
    if target == TARGETS["command"]:
        _commands(port, target.format(account=f"profile-{uuid.uuid4().hex[:8]}"), seconds)
        return
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        status, body = http.get(target.format(row=rng.randint(1, rows), group=rng.randint(0, 9999)))
        if status != 200:
            raise AssertionError(f"{target}: {status} {body[:200]!r}")


def _commands(port: int, target: str, seconds: float) -> None:
    """One client's deposits to its own account (opened first), one after another."""
    http = bench_eventstore.HttpClient(port)
    status, body = http.post(target, b'{"type": "open", "data": {"owner": "profile"}}')
    stop = time.monotonic() + seconds
    while status == 200 and time.monotonic() < stop:
        status, body = http.post(target, DEPOSIT)
    if status != 200:
        raise AssertionError(f"{target}: {status} {body[:200]!r}")


def layers(stats: pstats.Stats) -> dict[str, float]:
    """Share of the profiled CPU time per layer (exclusive time of each function)."""
    spent: Counter[str] = Counter()
    for (path, _, _), (_, _, exclusive, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        layer = next((name for name, pattern in LAYERS if re.search(pattern, path)), None)
        spent[layer or (C_CALLS if path == "~" else "other")] += exclusive
    total = sum(spent.values()) or 1.0
    return {name: spent[name] / total for name in [n for n, _ in LAYERS] + [C_CALLS, "other"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--http", default="h11", help="[api] http: h11 or httptools")
    parser.add_argument("--route", choices=sorted(TARGETS), default="point")
    parser.add_argument("--seconds", type=float, default=6.0, help="profiled seconds (after 2 s of warm-up)")
    parser.add_argument("--top", type=int, default=0, help="also list the N functions of most exclusive time")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tributary-profile-"))
    cluster = EmbeddedPostgres(work / "pg")
    cluster.up()
    try:
        command = args.route == "command"
        if command:
            run_migrations(cluster.dsn())
        else:
            bench_api._load(cluster.dsn(), args.rows)
        (work / "bench_view.py").write_text(bench_api.PROJECTION)
        port = _free_port()
        config = work / "serve.toml"
        config.write_text(
            f'[service]\ndsn = "{cluster.dsn()}"\n[log]\nroot = "{work / "log"}"\n'
            f'[projections]\nmodules = ["{work / "bench_view.py"}"]\n[api]\nport = {port}\nhttp = "{args.http}"\n'
            + ('[eventstore]\nmodules = ["tributary.eventstore.examples.bank"]\n' if command else "")
        )
        out = work / "serve.prof"
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER_THREADS if command else SERVER, str(config), str(out)], cwd=ROOT
        )
        _wait_healthy(port, server)
        clients = [
            mp.get_context("spawn").Process(
                target=_client, args=(port, TARGETS[args.route], args.rows, args.seconds + (2 if command else 4))
            )
            for _ in range(3)
        ]
        for c in clients:
            c.start()
        time.sleep(2)
        server.send_signal(signal.SIGUSR1)
        time.sleep(args.seconds)
        if command:  # the threads' profilers run on while they are busy: stop when the load has stopped
            for c in clients:
                c.join()
        server.send_signal(signal.SIGUSR2)
        for c in clients:
            c.join()
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)
        print(f"{args.route}, {args.http}: share of the server's profiled CPU time")
        stats = pstats.Stats(str(out))
        for name, share in layers(stats).items():
            print(f"{share * 100:5.1f} %  {name}")
        if args.top:
            stats.sort_stats("tottime").print_stats(args.top)
    finally:
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)  # the log, the config, the profile


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_healthy(port: int, server: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        try:
            if bench_api._Http(port).get("/healthz")[0] == 200:
                return
        except OSError:
            pass
        if server.poll() is not None:
            raise RuntimeError("tributary serve exited")
        time.sleep(0.2)
    raise RuntimeError("tributary serve did not become healthy")


if __name__ == "__main__":
    main()
