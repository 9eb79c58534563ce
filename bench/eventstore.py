"""Event store benchmark: appends/s through the store vs raw single-row INSERTs and a peer, and
commands/s over HTTP vs the Python API, in one run.

Default durability (fsync on, synchronous_commit on), one event per transaction, 1 and 4 writers;
the ceiling is a raw INSERT of the same values into an equivalent table (same columns, indexes and
constraints), the peer is the `eventsourcing` library's PostgreSQL application recorder
(`pip install -e '.[bench]'`);
the three take turns of --slice seconds (so they see the same disk), --seconds each per repeat.
Commands: a bank deposit through `CommandHandler.handle` in this process and through
`POST /commands` of `tributary serve`, 1 and 4 clients, taking turns the same way; commands/s,
p50/p99 latency and CPU per command of each side (`--compare-to` adds another checkout's API).
Plus loading an aggregate of 10,000 events with and without a snapshot, and (`--parts personal`)
commands whose event has personal-data fields, sealed vs plain. Prints JSON.

    .venv/bin/python bench/eventstore.py                  # embedded Postgres in a temp dir
    .venv/bin/python bench/eventstore.py --seconds 5 --repeat 3
    .venv/bin/python bench/eventstore.py --parts commands --compare-to ../baseline-checkout
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tributary.api.devdb.embedded import EmbeddedPostgres  # noqa: E402
from tributary.eventstore.aggregate import Aggregate  # noqa: E402
from tributary.eventstore.examples.bank import bank_account  # noqa: E402
from tributary.eventstore.handler import CommandHandler  # noqa: E402
from tributary.eventstore.migrate import run_migrations  # noqa: E402
from tributary.eventstore.model import NewEvent, dumps  # noqa: E402
from tributary.eventstore.personal import PersonalData  # noqa: E402
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
    sides: dict[str, Work],
    writers: int,
    seconds: float,
    slice_s: float,
    probe: psycopg.Connection[Any] | None = None,
    *,
    after_warmup: Callable[[], None] | None = None,
    other_cpu: Callable[[], float] | None = None,
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Appends/s of each side, which take turns in slices of `slice_s` (order reversed every round)
    until each has run `seconds`. The disk's fsync latency here swings several-fold within
    seconds (other work on the machine), so back-to-back blocks of seconds compare unequal
    conditions; turns of half a second give every side the same ones. With `probe` (a connection
    to the same server), also per append: WAL bytes, client CPU (this process), server CPU and
    time its processes waited for a CPU. With `other_cpu` (CPU seconds of another process so far,
    e.g. the API server's), instead CPU per call: this process's and the other's."""
    done = {name: [0] * writers for name in sides}
    for name, work in sides.items():  # connections made and statements prepared before the clock runs
        _run_threads(writers, 0.2, work, done[name])
    if after_warmup is not None:
        after_warmup()
    spent = {name: [0.0, 0.0] for name in sides}  # with other_cpu: this process s, the other's s
    n = dict.fromkeys(sides, 0)
    costs = {name: [0.0, 0.0, 0.0, 0.0] for name in sides}  # WAL bytes, client s, server s, queued s
    rounds = max(1, round(seconds / slice_s))
    names = list(sides)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            if probe is not None:
                lsn = probe.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
                srv, client = _server_ns(probe), time.process_time()
            if other_cpu is not None:
                mine, other = time.process_time(), other_cpu()
            n[name] += _run_threads(writers, slice_s, sides[name], done[name])
            if other_cpu is not None:
                spent[name][0] += time.process_time() - mine
                spent[name][1] += other_cpu() - other
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
    if other_cpu is not None:
        per_call = {
            name: {
                "this_process_us": spent[name][0] / n[name] * 1e6,
                "other_process_us": spent[name][1] / n[name] * 1e6,
            }
            for name in names
            if n[name]
        }
        return rates, per_call
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


class HttpClient:
    """A minimal keep-alive HTTP/1.1 client on one socket, as load generators such as wrk are: it
    sends a request and reads the response by its Content-Length (the API always sends one). It
    spends about a tenth of httpx's CPU per request; on a machine of two cores, what the load
    generator spends is taken from the server it measures (`--http-client httpx` to compare)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)  # a stuck server fails the run
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.sock.sendall(
            b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (path.encode(), len(body), body)
        )
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(int(v) for k, _, v in (h.partition(b":") for h in lines[1:]) if k.lower() == b"content-length")
        while len(rest) < length:
            self.buffer = rest
            self._read()
            rest = self.buffer
        self.buffer = rest[length:]
        return int(lines[0].split()[1]), rest[:length]

    def _read(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the API closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


class HttpxClient:
    """The same requests through httpx (the client the benchmark used before `HttpClient`)."""

    def __init__(self, port: int) -> None:
        import httpx

        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        r = self.client.post(path, content=body, headers={"content-type": "application/json"})
        return r.status_code, r.content

    def close(self) -> None:
        self.client.close()


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def api_server(dsn: str, work_dir: Path, checkout: Path = ROOT) -> Iterator[tuple[int, int]]:
    """`tributary serve` (uvicorn, its default settings) of `checkout` (its `.venv`) on a free
    loopback port: (port, pid)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = work_dir / f"bench-{port}.toml"
    # The bank example as a user's domain; a checkout from before `[eventstore] modules` (no
    # eventstore/examples/) served it without being told.
    domain = '[eventstore]\nmodules = ["tributary.eventstore.examples.bank"]\n'
    if not (checkout / "eventstore" / "examples" / "bank.py").exists():
        domain = ""
    config.write_text(f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{work_dir / "log"}"\n[api]\nport = {port}\n{domain}')
    python = sys.executable if checkout == ROOT else str(checkout / ".venv" / "bin" / "python")
    proc = subprocess.Popen(
        [python, "-c", "from tributary.api.cli.main import main; main()", "serve", "--config", str(config)],
        cwd=checkout,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as probe:
                    probe.sendall(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
                    if probe.recv(12).startswith(b"HTTP/1.1 200"):
                        break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("bench/eventstore.py: `tributary serve` did not start") from None
                time.sleep(0.2)
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def commands(
    handler: CommandHandler,
    servers: dict[str, tuple[int, int]],
    clients: int,
    seconds: float,
    slice_s: float,
    client_kind: str = "raw",
    command_ids: bool = False,
) -> dict[str, dict[str, float]]:
    """The same command (a deposit to the client's own account) through the Python API
    (`CommandHandler.handle` in this process) and through `POST /commands` of each API server
    (name -> (port, pid)), `clients` at a time, taking turns as the appends do. Per side:
    commands/s, latency p50/p99 and CPU per command (the Python API: this process; HTTP: the API
    server's, and the load generator's apart). `command_ids`: each command carries a new
    `command_id` (idempotent commands: the record is looked up and stored with the events)."""
    tag = uuid.uuid4().hex[:6]
    recording = threading.Event()
    latencies: dict[str, list[float]] = {"python_api": [], **{name: [] for name in servers}}
    for i in range(clients):
        handler.handle("account", f"py-{tag}-{i}", "open", {"owner": "bench"})
    client_type = HttpClient if client_kind == "raw" else HttpxClient
    sessions = {name: [client_type(port) for _ in range(clients)] for name, (port, _) in servers.items()}
    for name, clients_of in sessions.items():
        for i, c in enumerate(clients_of):
            status, reply = c.post(
                f"/commands/account/{name}-{tag}-{i}", b'{"type": "open", "data": {"owner": "bench"}}'
            )
            assert status == 200, reply
    deposit = b'{"type": "deposit", "data": {"amount": "1.00"}}'

    def body() -> bytes:
        if not command_ids:
            return deposit
        return b'{"type": "deposit", "data": {"amount": "1.00"}, "command_id": "%s"}' % uuid.uuid4().hex.encode()

    def python_api(i: int, _: int) -> None:
        t0 = time.perf_counter()
        command_id = uuid.uuid4().hex if command_ids else None
        handler.handle("account", f"py-{tag}-{i}", "deposit", {"amount": "1.00"}, command_id=command_id)
        if recording.is_set():
            latencies["python_api"].append(time.perf_counter() - t0)

    def over_http(name: str) -> Work:
        def work(i: int, _: int) -> None:
            t0 = time.perf_counter()
            status, reply = sessions[name][i].post(f"/commands/account/{name}-{tag}-{i}", body())
            if recording.is_set():
                latencies[name].append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"POST /commands answered {status}: {reply[:200]!r}")

        return work

    def servers_cpu() -> float:  # all API servers: only the one taking its turn is busy
        return sum(_process_cpu_s(pid) for _, pid in servers.values())

    try:
        rates, cpu = interleaved(
            {"python_api": python_api, **{name: over_http(name) for name in servers}},
            clients,
            seconds,
            slice_s,
            after_warmup=recording.set,
            other_cpu=servers_cpu,
        )
    finally:
        for clients_of in sessions.values():
            for c in clients_of:
                c.close()
    out = {}
    for side, rate in rates.items():
        out[side] = {
            "per_s": rate,
            "p50_ms": _percentile(latencies[side], 0.5) * 1e3,
            "p99_ms": _percentile(latencies[side], 0.99) * 1e3,
        }
        # The Python API's CPU is this process's; over HTTP this process only generates load.
        if side == "python_api":
            out[side]["cpu_us"] = cpu[side]["this_process_us"]
        else:
            out[side]["cpu_us"] = cpu[side]["other_process_us"]
            out[side]["load_generator_cpu_us"] = cpu[side]["this_process_us"]
    return out


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


def _median_of(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rows), 2) for k in rows[0]}


def appends_result(dsn: str, store: EventStore, args: argparse.Namespace) -> dict[str, Any]:
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
    return {
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
        **({"per_append_median": {k: _median_of(v) for k, v in costs.items()}} if costs else {}),
    }


class _Note(BaseModel):
    customer: str
    name: str
    email: str


class Noted(BaseModel):
    customer: str
    name: str
    email: str


class NotedSealed(BaseModel):
    customer: str
    name: Annotated[str, PersonalData(subject="customer")]
    email: Annotated[str, PersonalData(subject="customer")]


class _Notes(BaseModel):
    notes: int = 0


def _profile_domain(personal: bool) -> Aggregate[_Notes]:
    """One command, `note`, appending one event (customer, name, email); with `personal` the name
    and email are personal data of the customer (sealed), else plain."""
    event = NotedSealed if personal else Noted
    return Aggregate(
        stream_type="profile",
        state_type=_Notes,
        commands={"note": _Note},
        events=[event],
        decide=lambda state, c: [event(customer=c.customer, name=c.name, email=c.email)],
        evolve=lambda state, e: _Notes(notes=state.notes + 1),
    )


def personal_result(store: EventStore, args: argparse.Namespace) -> dict[str, Any]:
    """Commands/s (each a new stream, one event) of one domain with its personal-data fields
    sealed vs plain, taking turns in one run; 1 and 4 writers, medians of the repeats. A sealed
    command also looks up its subject's key (one of 16 customers per writer, made once)."""

    def side(personal: bool) -> Work:
        handler = CommandHandler(store, {"profile": _profile_domain(personal)})
        kind, tag = "sealed" if personal else "plain", uuid.uuid4().hex[:8]  # a tag per run: counts restart

        def work(i: int, k: int) -> None:
            data = {"customer": f"cust-{tag}-{i}-{k % 16}", "name": f"Name {k}", "email": f"n{k}@example.org"}
            handler.handle("profile", f"{kind}-{tag}-{i}-{k}", "note", data, expected_version="no_stream")

        return work

    runs: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for writers in (1, 4):
            rates, _costs = interleaved({"plain": side(False), "sealed": side(True)}, writers, args.seconds, args.slice)
            for name, rate in rates.items():
                runs.setdefault(f"{name}_{writers}w", []).append(rate)
    med = {k: round(statistics.median(v), 1) for k, v in runs.items()}
    return {
        "commands_per_s_median": med,
        "ratio_sealed_vs_plain": {w: round(med[f"sealed_{w}"] / med[f"plain_{w}"], 3) for w in ("1w", "4w")},
        "ratio_sealed_vs_plain_per_repeat": {
            w: [round(a / b, 3) for a, b in zip(runs[f"sealed_{w}"], runs[f"plain_{w}"], strict=True)]
            for w in ("1w", "4w")
        },
        "what": "CommandHandler.handle, one event with two personal-data fields (AES-256-GCM) vs the same fields plain",
    }


def commands_result(dsn: str, store: EventStore, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Commands/s over HTTP and through the Python API, 1 and 4 clients, medians of the repeats."""
    handler = CommandHandler(store, {"account": bank_account()}, snapshot_every=100)  # as `serve`'s defaults
    out: dict[str, Any] = {"http_client": args.http_client, "command_ids": args.command_ids, "target_ratio": 0.7}
    with ExitStack() as stack:
        servers = {"http": stack.enter_context(api_server(dsn, work))}
        if args.compare_to is not None:
            servers["http_old"] = stack.enter_context(api_server(dsn, work, args.compare_to.resolve()))
        for clients in (1, 4):
            rows = [
                commands(handler, servers, clients, args.seconds, args.slice, args.http_client, args.command_ids)
                for _ in range(args.repeat)
            ]
            py = _median_of([r["python_api"] for r in rows])
            result: dict[str, Any] = {"python_api": py}
            for name in servers:
                http = _median_of([r[name] for r in rows])
                result[name] = http
                result[f"{name}_vs_python_ratio"] = round(http["per_s"] / py["per_s"], 3)
                result[f"{name}_ratio_per_repeat"] = [
                    round(r[name]["per_s"] / r["python_api"]["per_s"], 3) for r in rows
                ]
            out[f"clients_{clients}"] = result
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
    parser.add_argument(
        "--parts",
        default="appends,commands,load",
        help="comma-separated: appends (vs raw INSERT and the peer), commands (HTTP vs the Python API), load, "
        "personal (commands with personal-data fields sealed vs plain)",
    )
    parser.add_argument(
        "--http-client",
        choices=("raw", "httpx"),
        default="raw",
        help="load generator of the HTTP commands: a minimal keep-alive client (default) or httpx",
    )
    parser.add_argument(
        "--synchronous-commit-off",
        action="store_true",
        help="embedded server only: no wait for the WAL flush at commit, so the figures show the CPU and round "
        "trips of each side rather than the disk's fsync",
    )
    parser.add_argument(
        "--command-ids",
        action="store_true",
        help="commands: each carries a new command_id (idempotent commands)",
    )
    parser.add_argument(
        "--compare-to",
        type=Path,
        metavar="CHECKOUT",
        help="commands: also the API of another checkout (its .venv/bin/python), taking turns with this one",
    )
    parser.add_argument("--dsn", help="use this server instead of an embedded one")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "eventstore.json")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    known = {"appends", "commands", "load", "personal"}
    if parts - known:
        raise SystemExit(f"bench/eventstore.py: unknown --parts {', '.join(sorted(parts - known))}")
    if "appends" in parts:
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
        if args.synchronous_commit_off:
            if args.dsn:
                raise SystemExit("--synchronous-commit-off changes the server's settings: only on the embedded server")
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_commit = off")
                conn.execute("SELECT pg_reload_conf()")
        if args.cpu_ab:
            if args.dsn:
                raise SystemExit("--cpu-ab changes synchronous_commit: only on the embedded server")
            print(json.dumps(cpu_ab(dsn, args.cpu_ab, args.seconds, args.repeat), indent=1))
            return
        store = EventStore.connect(dsn, max_size=8)
        result: dict[str, Any] = {}
        if "appends" in parts:
            result.update(appends_result(dsn, store, args))
        if "commands" in parts:
            result["commands"] = commands_result(dsn, store, work, args)
        if "load" in parts:
            result["load"] = load_times(store, args.load_events)
        if "personal" in parts:
            result["personal"] = personal_result(store, args)
        result.update(
            {
                "runs": args.repeat,
                "seconds_per_run": args.seconds,
                "slice_s": args.slice,
                "synchronous_commit": "off" if args.synchronous_commit_off else "on",
            }
        )
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
