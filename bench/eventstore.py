"""Event store benchmark: appends/s through the store vs raw single-row INSERTs and a peer, in one run.

Default durability (fsync on, synchronous_commit on), one event per transaction, 1 and 4 writers;
the ceiling is a raw INSERT of the same values into an equivalent table (same columns, indexes and
constraints), the peer is the `eventsourcing` library's PostgreSQL application recorder
(`pip install -e '.[bench]'`);
the three take turns of --slice seconds (so they see the same disk), --seconds each per repeat;
plus loading an aggregate of 10,000 events with and without a snapshot. Prints JSON.

    .venv/bin/python bench/eventstore.py                  # embedded Postgres in a temp dir
    .venv/bin/python bench/eventstore.py --seconds 5 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tributary.api.devdb.embedded import EmbeddedPostgres  # noqa: E402
from tributary.eventstore.examples.bank import bank_account  # noqa: E402
from tributary.eventstore.handler import CommandHandler  # noqa: E402
from tributary.eventstore.migrate import run_migrations  # noqa: E402
from tributary.eventstore.model import NewEvent, dumps  # noqa: E402
from tributary.eventstore.store import EventStore  # noqa: E402

RAW_TABLE = """
CREATE TABLE IF NOT EXISTS raw_events (
  global_position bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, stream_id text NOT NULL,
  stream_type text NOT NULL, version bigint NOT NULL CHECK (version > 0), event_id uuid NOT NULL UNIQUE, type text NOT NULL,
  schema_version int NOT NULL, data jsonb NOT NULL, metadata jsonb NOT NULL,
  occurred_at timestamptz NOT NULL DEFAULT now(), recorded_at timestamptz NOT NULL DEFAULT now(),
  transaction_id xid8 NOT NULL DEFAULT pg_current_xact_id(), UNIQUE (stream_id, version));
CREATE INDEX IF NOT EXISTS raw_events_transaction_position ON raw_events (transaction_id, global_position);
CREATE INDEX IF NOT EXISTS raw_events_type_transaction_position ON raw_events (stream_type, transaction_id, global_position);
CREATE INDEX IF NOT EXISTS raw_events_type_streams ON raw_events (stream_type, stream_id) WHERE version = 1
"""


Work = Callable[[int, int], None]  # (writer, how many it has done) -> one append


def _run_threads(n: int, seconds: float, work: Work, done: list[int] | None = None) -> int:
    """`n` threads call `work` for `seconds`; `done` carries each writer's count across calls."""
    counts = done if done is not None else [0] * n
    before = sum(counts)
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            work(i, counts[i])
            counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) - before


def _server_ns(probe: psycopg.Connection[Any]) -> tuple[int, int]:
    """CPU time and run-queue wait (ns) so far of this database's backends and the WAL writer,
    from /proc/<pid>/schedstat (the server must run on this machine, as the embedded one does)."""
    cpu = wait = 0
    for (pid,) in probe.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
        " OR (backend_type = 'client backend' AND datname = current_database())"
    ):
        try:
            on_cpu, queued, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        cpu, wait = cpu + int(on_cpu), wait + int(queued)
    return cpu, wait


def interleaved(
    sides: dict[str, Work], writers: int, seconds: float, slice_s: float, probe: psycopg.Connection[Any] | None = None
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Appends/s of each side, which take turns in slices of `slice_s` (order reversed every round)
    until each has run `seconds`. The disk's fsync latency here swings several-fold within
    seconds (other work on the machine), so back-to-back blocks of seconds compare unequal
    conditions; turns of half a second give every side the same ones. With `probe` (a connection
    to the same server), also per append: WAL bytes, client CPU (this process), server CPU and
    time its processes waited for a CPU."""
    done = {name: [0] * writers for name in sides}
    for name, work in sides.items():  # connections made and statements prepared before the clock runs
        _run_threads(writers, 0.2, work, done[name])
    n = dict.fromkeys(sides, 0)
    costs = {name: [0.0, 0.0, 0.0, 0.0] for name in sides}  # WAL bytes, client s, server s, queued s
    rounds = max(1, round(seconds / slice_s))
    names = list(sides)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            if probe is not None:
                lsn = probe.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
                srv, client = _server_ns(probe), time.process_time()
            n[name] += _run_threads(writers, slice_s, sides[name], done[name])
            if probe is not None:
                client = time.process_time() - client
                wal = probe.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (lsn,)).fetchone()[0]  # type: ignore[index]
                srv_end = _server_ns(probe)
                c = costs[name]
                c[0] += float(wal)
                c[1] += client
                c[2] += (srv_end[0] - srv[0]) / 1e9
                c[3] += (srv_end[1] - srv[1]) / 1e9
    rates = {name: n[name] / (rounds * slice_s) for name in names}
    per_append = {
        name: {
            "wal_bytes": round(costs[name][0] / n[name]),
            "client_cpu_us": round(costs[name][1] / n[name] * 1e6, 1),
            "server_cpu_us": round(costs[name][2] / n[name] * 1e6, 1),
            "server_cpu_wait_us": round(costs[name][3] / n[name] * 1e6, 1),
        }
        for name in names
        if probe is not None and n[name]
    }
    return rates, per_append


_RAW_INSERT = (
    "INSERT INTO raw_events (stream_id, stream_type, version, event_id, type, schema_version, data, metadata,"
    " occurred_at) VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb, %s)"
)
_RAW_LITERALS = (
    "INSERT INTO raw_events (stream_id, stream_type, version, event_id, type, schema_version, data, metadata) "
    "VALUES (%s, 'bench', %s, %s, 'Happened', 1, '{\"amount\": \"1.00\"}', '{}')"
)


@contextmanager
def raw_side(dsn: str, writers: int, *, literals: bool = False) -> Iterator[Work]:
    """The ceiling: single-row INSERTs with psycopg, one connection per writer. Each writer reuses
    one cursor, as the store does (`conn.execute` makes a cursor per call, extra client CPU that
    would handicap the ceiling). It binds the values the store writes (stream, type, event id, data
    and metadata serialised as the store does, occurred_at): the same work per row. With `literals`
    (the older ceiling, `--literal-ceiling`), type, data and metadata are constants of the
    statement and occurred_at its default: the server parses that JSON once per prepared plan, not
    once per event as any real append must, so it flatters the ceiling."""
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(writers)]
    cursors = [c.cursor() for c in conns]
    tag = uuid.uuid4().hex[:6]

    def work(i: int, k: int) -> None:
        data, meta = dumps({"amount": "1.00"}).decode(), dumps({}).decode()
        cursors[i].execute(
            _RAW_INSERT,
            (f"raw-{tag}-{i}", "bench", k + 1, uuid.uuid4(), "Happened", 1, data, meta, datetime.now(UTC)),
        )

    def work_literals(i: int, k: int) -> None:
        cursors[i].execute(_RAW_LITERALS, (f"rawlit-{tag}-{i}", k + 1, uuid.uuid4()))

    try:
        yield work_literals if literals else work
    finally:
        for c in conns:
            c.close()


def store_side(store: EventStore) -> Work:
    tag = uuid.uuid4().hex[:6]

    def work(i: int, k: int) -> None:
        store.append(f"es-{tag}-{i}", "bench", [NewEvent(type="Happened", data={"amount": "1.00"})], k)

    return work


@contextmanager
def peer_side(dsn: str, writers: int) -> Iterator[Work]:
    """The `eventsourcing` library's PostgreSQL application recorder (global notification ids)."""
    from eventsourcing.persistence import StoredEvent
    from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

    info = conninfo_to_dict(dsn)
    datastore = PostgresDatastore(
        str(info.get("dbname", "postgres")),
        str(info.get("host", "127.0.0.1")),
        str(info.get("port", 5432)),
        str(info.get("user", "postgres")),
        str(info.get("password", "")),
        pool_size=writers,
        schema="peer",
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS peer")
    recorder = PostgresApplicationRecorder(datastore, events_table_name="stored_events")
    recorder.create_table()
    ids = [uuid.uuid4() for _ in range(writers)]
    state = b'{"amount": "1.00"}'

    def work(i: int, k: int) -> None:
        recorder.insert_events([StoredEvent(ids[i], k + 1, "bench:Happened", state)])

    try:
        yield work
    finally:
        datastore.close()


def appends(
    dsn: str,
    store: EventStore,
    writers: int,
    seconds: float,
    slice_s: float,
    probe: psycopg.Connection[Any] | None,
    literal_ceiling: bool = False,
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    with ExitStack() as stack:
        sides = {"raw": stack.enter_context(raw_side(dsn, writers)), "store": store_side(store)}
        sides["peer"] = stack.enter_context(peer_side(dsn, writers))
        if literal_ceiling:
            sides["rawlit"] = stack.enter_context(raw_side(dsn, writers, literals=True))
        return interleaved(sides, writers, seconds, slice_s, probe)


def load_times(store: EventStore, events: int) -> dict[str, float]:
    handler = CommandHandler(store, {"account": bank_account()}, snapshot_every=None)
    stream = f"big-{uuid.uuid4().hex[:6]}"
    handler.handle("account", stream, "open", {"owner": "bench"})
    batch = 500
    for start in range(1, events, batch):
        n = min(batch, events - start)
        store.append(
            stream, "account", [NewEvent(type="MoneyDeposited", data={"amount": "1.00"}) for _ in range(n)], start
        )
    t0 = time.perf_counter()
    plain = handler.load("account", stream, use_snapshot=False)
    no_snap = time.perf_counter() - t0
    state = plain.state.model_dump(mode="json")
    store.save_snapshot(stream, "account", plain.version, state, 1)
    snap_handler = CommandHandler(store, {"account": bank_account()}, snapshot_every=100)
    t0 = time.perf_counter()
    loaded = snap_handler.load("account", stream)
    with_snap = time.perf_counter() - t0
    assert loaded.state == plain.state
    return {"events": plain.version, "load_s_without_snapshot": no_snap, "load_s_with_snapshot": with_snap}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def commands_python(handler: CommandHandler, clients: int, seconds: float) -> dict[str, float]:
    tag = uuid.uuid4().hex[:6]
    for i in range(clients):
        handler.handle("account", f"py-{tag}-{i}", "open", {"owner": "bench"})
    latencies: list[float] = []

    def work(i: int, _: int) -> None:
        t0 = time.perf_counter()
        handler.handle("account", f"py-{tag}-{i}", "deposit", {"amount": "1.00"})
        latencies.append(time.perf_counter() - t0)

    n = _run_threads(clients, seconds, work)
    return {
        "per_s": n / seconds,
        "p50_ms": _percentile(latencies, 0.5) * 1e3,
        "p99_ms": _percentile(latencies, 0.99) * 1e3,
    }


def commands_http(dsn: str, work_dir: Path, clients: int, seconds: float) -> dict[str, float]:
    """The same commands through `tributary serve` (uvicorn) on loopback, `clients` at a time."""
    import socket
    import subprocess

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = work_dir / "bench.toml"
    config.write_text(f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{work_dir / "log"}"\n[api]\nport = {port}\n')
    proc = subprocess.Popen(
        [sys.executable, "-c", "from tributary.api.cli.main import main; main()", "serve", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        tag = uuid.uuid4().hex[:6]
        sessions = [httpx.Client(base_url=base, timeout=30) for _ in range(clients)]
        for i, c in enumerate(sessions):
            c.post(
                f"/commands/account/http-{tag}-{i}", json={"type": "open", "data": {"owner": "bench"}}
            ).raise_for_status()
        latencies: list[float] = []

        def work(i: int, _: int) -> None:
            t0 = time.perf_counter()
            r = sessions[i].post(
                f"/commands/account/http-{tag}-{i}", json={"type": "deposit", "data": {"amount": "1.00"}}
            )
            latencies.append(time.perf_counter() - t0)
            r.raise_for_status()

        n = _run_threads(clients, seconds, work)
        for c in sessions:
            c.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {
        "per_s": n / seconds,
        "p50_ms": _percentile(latencies, 0.5) * 1e3,
        "p99_ms": _percentile(latencies, 0.99) * 1e3,
    }


def cpu_ab(dsn: str, other_store: Path, seconds: float, repeat: int) -> dict[str, Any]:
    """CPU per append of the store against another version of `eventstore/store.py` (e.g. an older
    commit's, `git show <rev>:eventstore/store.py > /tmp/old_store.py`) and both ceilings, in one
    run, with synchronous_commit off: without the fsync wait the turns measure CPU, which is what a
    change to the statement or the client path moves. Medians and ranges over `repeat`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("other_store", other_store)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["other_store"] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET synchronous_commit = off")
        conn.execute("SELECT pg_reload_conf()")
    store, other = EventStore.connect(dsn, max_size=8), module.EventStore.connect(dsn, max_size=8)
    out: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as probe:
        for writers in (1, 4):
            costs: dict[str, list[float]] = {}
            for _ in range(repeat):
                with raw_side(dsn, writers) as raw, raw_side(dsn, writers, literals=True) as rawlit:
                    sides = {"raw": raw, "rawlit": rawlit, "other": store_side(other), "store": store_side(store)}
                    _, per_append = interleaved(sides, writers, seconds, 0.5, probe)
                for side, c in per_append.items():
                    costs.setdefault(side, []).append(c["client_cpu_us"] + c["server_cpu_us"])
                    costs.setdefault(f"{side}_client", []).append(c["client_cpu_us"])
                    costs.setdefault(f"{side}_server", []).append(c["server_cpu_us"])
            out[f"{writers}w_cpu_us_per_append"] = {
                k: {"median": round(statistics.median(v), 1), "range": [round(min(v), 1), round(max(v), 1)]}
                for k, v in costs.items()
            }
    store.close()
    other.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0, help="per side, writer count and repeat")
    parser.add_argument("--slice", type=float, default=0.5, help="the sides take turns of this many seconds")
    parser.add_argument(
        "--costs",
        action="store_true",
        help="also per append: WAL bytes, client CPU, server CPU and CPU wait (medians; the server on this machine)",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--literal-ceiling",
        action="store_true",
        help="also the older ceiling: type, data and metadata literals in the INSERT (see raw_side)",
    )
    parser.add_argument("--load-events", type=int, default=10_000)
    parser.add_argument(
        "--cpu-ab",
        type=Path,
        metavar="STORE_PY",
        help="only CPU per append (synchronous_commit off) of the store vs this other store.py and both ceilings",
    )
    parser.add_argument("--dsn", help="use this server instead of an embedded one")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "eventstore.json")
    args = parser.parse_args()
    try:
        import eventsourcing  # noqa: F401 - the peer
    except ImportError:
        raise SystemExit("bench/eventstore.py: the peer is missing: .venv/bin/pip install -e '.[bench]'") from None
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-"))
    cluster = None
    if args.dsn:
        dsn = args.dsn
    else:
        cluster = EmbeddedPostgres(work / "pg")
        cluster.up()
        dsn = cluster.dsn()
    try:
        run_migrations(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(RAW_TABLE)
        if args.cpu_ab:
            if args.dsn:
                raise SystemExit("--cpu-ab changes synchronous_commit: only on the embedded server")
            print(json.dumps(cpu_ab(dsn, args.cpu_ab, args.seconds, args.repeat), indent=1))
            return
        store = EventStore.connect(dsn, max_size=8)
        runs: dict[str, list[float]] = {}
        costs: dict[str, list[dict[str, float]]] = {}
        probe = psycopg.connect(dsn, autocommit=True) if args.costs else None
        for _ in range(args.repeat):
            for writers in (1, 4):
                rates, per_append = appends(dsn, store, writers, args.seconds, args.slice, probe, args.literal_ceiling)
                for side, rate in rates.items():
                    runs.setdefault(f"{side}_{writers}w", []).append(rate)
                for side, cost in per_append.items():
                    costs.setdefault(f"{side}_{writers}w", []).append(cost)
        if probe is not None:
            probe.close()
        med = {k: round(statistics.median(v), 1) for k, v in runs.items()}
        handler = CommandHandler(store, {"account": bank_account()}, snapshot_every=100)
        py_runs, http_runs = [], []
        for _ in range(args.repeat):
            py_runs.append(commands_python(handler, 4, args.seconds))
            http_runs.append(commands_http(dsn, work, 4, args.seconds))

        def med_of(rows: list[dict[str, float]]) -> dict[str, float]:
            return {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}

        py, http = med_of(py_runs), med_of(http_runs)
        result = {
            "commands_4_clients": {
                "python_api": py,
                "http": http,
                "http_vs_python_ratio": round(http["per_s"] / py["per_s"], 3),
            },
            "appends_per_s_median": med,
            "ratio_store_vs_raw": {w: round(med[f"store_{w}"] / med[f"raw_{w}"], 3) for w in ("1w", "4w")},
            "ratio_store_vs_raw_per_repeat": {
                w: [round(st / raw, 3) for st, raw in zip(runs[f"store_{w}"], runs[f"raw_{w}"], strict=True)]
                for w in ("1w", "4w")
            },
            "target_ratio": 0.8,
            **(
                {
                    "ratio_store_vs_raw_literals_per_repeat": {
                        w: [round(st / raw, 3) for st, raw in zip(runs[f"store_{w}"], runs[f"rawlit_{w}"], strict=True)]
                        for w in ("1w", "4w")
                    }
                }
                if args.literal_ceiling
                else {}
            ),
            "ratio_store_vs_peer": {w: round(med[f"store_{w}"] / med[f"peer_{w}"], 3) for w in ("1w", "4w")},
            "peer": "eventsourcing PostgresApplicationRecorder, one event per insert_events call",
            "target_ratio_vs_peer": 1.5,
            "load": load_times(store, args.load_events),
            **({"per_append_median": {k: med_of(v) for k, v in costs.items()}} if costs else {}),
            "runs": args.repeat,
            "seconds_per_run": args.seconds,
            "slice_s": args.slice,
        }
        store.close()
    finally:
        if cluster is not None:
            cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
