"""`bench/capture.py --peer debezium`: tributary (Kafka backend) against Debezium's PostgreSQL
connector in Kafka Connect, the same tables, the same broker, the same run.

One real broker (api/devkafka's EmbeddedKafka, as the tests start it); Debezium runs through
tests/debezium.py (the settings that match our envelope; the JVM as `connect-standalone.sh` runs
it). For each measure and repeat the two alternate who goes first, each on its own slot and its
own topic (4 partitions, compacted, made before the run for both alike):

- streaming: both slots made, then a backlog of `rows` inserts (transactions of 100) written;
  each peer started on its slot, timed from its process start until all `rows` changes are
  visible to a read_committed consumer of its topic (and from its first change visible);
- snapshot: a `snapshot_rows` table read by each peer's initial snapshot, timed the same way;
- latency: commit → visible to a read_committed consumer, p50/p99, at a paced 1,000 tx/s (on 4
  connections, after 3 s of warm-up at the same pace);
- CPU seconds per change of each peer's process tree (Connect's JVM; tributary's daemon), of
  PostgreSQL and of the broker, and each peer's peak RSS.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg

from bench._paced import paced_writes
from tests.debezium import CONNECT_JVM, run_debezium
from tributary.api.devdb import free_port
from tributary.api.devkafka import EmbeddedKafka
from tributary.capture.status import read_status

_CLI = "from tributary.api.cli.main import main; main()"
PARTITIONS = 4
_TICK = os.sysconf("SC_CLK_TCK")
_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024
DEADLINE_S = 3600.0
# Connector settings given with `--debezium-set KEY=VALUE` (a tuning to compare with the defaults),
# set once by `compare` before any run.
DEBEZIUM_SETTINGS: dict[str, str] = {}
WRITERS = 4  # connections of the paced writer (as bench/consumers.py's latency)


# -- processes -------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (index 0 = state), or None once gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _tree(pid: int) -> list[int]:
    """`pid` and its live descendants (Connect's JVM has none; capture may start helpers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of the process tree so far, reaped children included."""
    total = 0.0
    for p in _tree(pid):
        fields = _stat(p)
        if fields is not None:
            total += sum(int(f) for f in fields[11:15]) / _TICK
    return total


def tree_peak_rss_mb(pid: int) -> float:
    """The tree's peak resident memory: the sum of each live process's high-water mark (VmHWM)."""
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
    return total / 1024


def _pids_with(text: str) -> list[int]:
    """Processes whose command line holds `text` (the broker's JVM, found by its data directory)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
    return out


# -- the broker and its topics ----------------------------------------------------------------


@dataclass
class Broker:
    """One Kafka node on loopback and what it needs to be measured."""

    kafka: EmbeddedKafka
    bootstraps: str

    def cpu_s(self) -> float:
        """CPU seconds of the broker's JVM so far."""
        return sum(tree_cpu_s(p) for p in _pids_with(str(self.kafka.data_dir)))

    def create(self, *topics: str) -> None:
        """`topics` with 4 partitions, compacted (as tributary makes its own), for both peers alike."""
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # documented home

        admin = AdminClient({"bootstrap.servers": self.bootstraps, "log_level": 3})
        futures = admin.create_topics(
            [NewTopic(t, PARTITIONS, 1, config={"cleanup.policy": "compact"}) for t in topics]
        )
        for future in futures.values():
            future.result(timeout=120)


@contextlib.contextmanager
def broker(work: Path) -> Iterator[Broker]:
    """A single-node KRaft broker under `work`, down after."""
    kafka = EmbeddedKafka(work / "kafka", heap="1g")
    bootstraps = kafka.up(port=free_port())
    try:
        yield Broker(kafka, bootstraps)
    finally:
        kafka.down(timeout=60)


class Watch:
    """A read_committed consumer of one topic from its start: counts changes (records whose value
    has an `op`; tributary's schema records and tombstones have none) and hands each value on."""

    def __init__(self, bootstraps: str, topic: str, on_value: Callable[[bytes], None] | None = None) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstraps,
                "group.id": f"bench-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 10,
                "log_level": 3,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        self.changes = 0
        self.first_at: float | None = None
        self.on_value = on_value

    def poll(self, timeout: float = 0.05) -> None:
        """Read what is visible now (up to 10,000 records)."""
        for msg in self.consumer.consume(10_000, timeout):
            value = msg.value()
            if msg.error() is None and value and b'"op"' in value:
                self.changes += 1
                if self.first_at is None:
                    self.first_at = time.perf_counter()
                if self.on_value is not None:
                    self.on_value(value)

    def close(self) -> None:
        self.consumer.close()


# -- the two peers -------------------------------------------------------------------------------


def _tributary_config(path: Path, dsn: str, work: Path, source: str, table: str, snapshot: str, kafka: str) -> Path:
    """tributary on the Kafka backend: one source `source` on slot `source`, one table."""
    path.write_text(
        f'[log]\nroot = "{work / ("log-" + source)}"\npartitions = {PARTITIONS}\nbackend = "kafka"\n\n'
        f'[log.kafka]\nbootstrap_servers = "{kafka}"\npartitions = {PARTITIONS}\nreplication_factor = 1\n'
        'client = { "log_level" = "3" }\n\n[capture]\ncapture_eventstore = false\n\n'
        f'[[sources]]\nname = "{source}"\ndsn = "{dsn}"\nslot = "{source}"\ninclude = ["public.{table}"]\n'
        f'snapshot = "{snapshot}"\n'
    )
    return path


@contextlib.contextmanager
def tributary(config: Path) -> Iterator[int]:
    """`tributary capture` on `config`; yields its pid; terminated after."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI, "capture", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[1],
    )
    try:
        yield proc.pid
        if proc.poll() is not None:
            raise RuntimeError(f"capture exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def _debezium_overrides(tag: str, slot: str, mode: str) -> dict[str, str]:
    """Per run: its slot, publication, snapshot mode and topic `dbz_<tag>.…` (4 partitions)."""
    return {
        "slot.name": slot,
        "publication.name": f"{slot}_pub",
        "snapshot.mode": mode,
        "topic.creation.default.partitions": str(PARTITIONS),
        "transforms.rename.replacement": f"dbz_{tag}.$1",
        **DEBEZIUM_SETTINGS,
    }


@contextlib.contextmanager
def debezium(
    dsn: str, kafka: str, work: Path, tag: str, table: str, mode: str, *, wait_ready: bool = False
) -> Iterator[int]:
    """Connect + Debezium for one run (its work directory, offsets included, under `work/dbz-<tag>`)."""
    with run_debezium(
        dsn,
        kafka,
        work / f"dbz-{tag}",
        source=f"src_{tag}",
        tables=[f"public.{table}"],
        overrides=_debezium_overrides(tag, f"dbz_{tag}", mode),
        jvm=CONNECT_JVM,
        wait_ready=wait_ready,
    ) as connect:
        yield connect.proc.pid
        connect.alive()


def _topic(peer: str, tag: str, table: str) -> str:
    return f"{tag}.public.{table}" if peer == "tributary" else f"dbz_{tag}.public.{table}"


# -- measures -----------------------------------------------------------------------------------


@dataclass
class Counters:
    """CPU seconds of PostgreSQL and the broker, read before and after a run."""

    server: Callable[[], float]
    broker: Callable[[], float]

    def read(self) -> tuple[float, float]:
        return self.server(), self.broker()


def _timed(
    peer_run: contextlib.AbstractContextManager[int], watch: Watch, expected: int, counters: Counters
) -> dict[str, float]:
    """Start a peer, wait until `expected` changes are visible read_committed; its seconds (from
    its start, and from its first change visible), CPU seconds and peak RSS, the server's and
    broker's CPU seconds over the run."""
    s0, b0 = counters.read()
    start = time.perf_counter()
    with peer_run as pid:
        while watch.changes < expected:
            watch.poll()
            if time.perf_counter() - start > DEADLINE_S:
                raise RuntimeError(f"{watch.changes} of {expected} changes visible after {DEADLINE_S} s")
            if _stat(pid) is None or _stat(pid)[0] == "Z":  # type: ignore[index]
                raise RuntimeError("the peer exited before its changes were visible")
        done = time.perf_counter()
        cpu, rss = tree_cpu_s(pid), tree_peak_rss_mb(pid)
    s1, b1 = counters.read()
    return {
        "s": done - start,
        "from_first_s": done - (watch.first_at or start),
        "cpu_s": cpu,
        "peak_rss_mb": rss,
        "server_cpu_s": s1 - s0,
        "broker_cpu_s": b1 - b0,
    }


def _per(rows: int, out: dict[str, float], unit: str) -> dict[str, float]:
    """A run's figures per change: rate, rate from the first change, µs of CPU, RSS."""
    us = 1e6 / rows
    return {
        f"{unit}_per_s": rows / out["s"],
        f"steady_{unit}_per_s": rows / out["from_first_s"],
        "cpu_us": out["cpu_s"] * us,
        "server_cpu_us": out["server_cpu_s"] * us,
        "broker_cpu_us": out["broker_cpu_s"] * us,
        "peak_rss_mb": out["peak_rss_mb"],
    }


def _order(turn: int) -> list[str]:
    return ["tributary", "debezium"] if turn % 2 == 0 else ["debezium", "tributary"]


def bench_streaming(dsn: str, br: Broker, work: Path, rows: int, turn: int, counters: Counters) -> dict[str, Any]:
    """Both slots made (Debezium's by a first start in `no_data` mode, stopped once it streams),
    then `rows` inserts in transactions of 100, then each peer drains them."""
    table = f"stream_{turn}"
    tag = f"s{turn}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, a int, b text, c timestamptz)")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (tag,))
    br.create(_topic("tributary", tag, table), _topic("debezium", tag, table))
    with debezium(dsn, br.bootstraps, work, tag, table, "no_data", wait_ready=True):
        pass  # its slot and publication made, its offsets stored in its work directory
    with psycopg.connect(dsn, autocommit=True) as conn:
        for lo in range(0, rows, 100):
            conn.execute(
                f"INSERT INTO {table} (a, b, c) SELECT g, md5(g::text) || md5((g+1)::text) || 'xxxxxxxx', now() "
                "FROM generate_series(%s::int, %s::int) g",
                (lo + 1, min(lo + 100, rows)),
            )
    out: dict[str, Any] = {}
    for peer in _order(turn):
        watch = Watch(br.bootstraps, _topic(peer, tag, table))
        try:
            run = (
                tributary(_tributary_config(work / f"{tag}.toml", dsn, work, tag, table, "never", br.bootstraps))
                if peer == "tributary"
                else debezium(dsn, br.bootstraps, work, tag, table, "no_data")
            )
            out[peer] = _per(rows, _timed(run, watch, rows, counters), "changes")
        finally:
            watch.close()
    _drop(dsn, [tag, f"dbz_{tag}"], table)
    return out


def bench_snapshot(dsn: str, br: Broker, work: Path, rows: int, turn: int, counters: Counters) -> dict[str, Any]:
    """A `rows`-row table, read by each peer's initial snapshot on a new slot."""
    table = f"snap_{turn}"
    tag = f"n{turn}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, a int, b text, c timestamptz)")
        conn.execute(
            f"INSERT INTO {table} (a, b, c) SELECT g, md5(g::text) || md5((g+1)::text), now() "
            "FROM generate_series(1, %s) g",
            (rows,),
        )
        conn.execute(f"VACUUM ANALYZE {table}")
    br.create(_topic("tributary", tag, table), _topic("debezium", tag, table))
    out: dict[str, Any] = {}
    for peer in _order(turn):
        os.sync()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        watch = Watch(br.bootstraps, _topic(peer, tag, table))
        try:
            run = (
                tributary(_tributary_config(work / f"{tag}.toml", dsn, work, tag, table, "initial", br.bootstraps))
                if peer == "tributary"
                else debezium(dsn, br.bootstraps, work, tag, table, "initial")
            )
            out[peer] = _per(rows, _timed(run, watch, rows, counters), "rows")
        finally:
            watch.close()
    _drop(dsn, [tag, f"dbz_{tag}"], table)
    return out


def _drop(dsn: str, slots: list[str], table: str) -> None:
    """The run's slots (so they hold no WAL) and its table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for slot in slots:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            )
        conn.execute(f"DROP TABLE {table}")


def _streaming_started(work: Path, source: str) -> Callable[[], bool]:
    def started() -> bool:
        status = read_status(work / f"log-{source}") or {}
        return any(s.get("state") == "streaming" for s in status.get("sources", []))

    return started


def bench_latency(dsn: str, br: Broker, work: Path, seconds: float, tps: int, turn: int) -> dict[str, Any]:
    """Commit → visible read_committed at `tps` one-row transactions a second, each peer in turn;
    a first row (run -1) seen before the paced writes start, so both readers are at the topic."""
    table = f"lat_{turn}"
    tag = f"l{turn}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, run int, sent double precision)")
    br.create(_topic("tributary", tag, table), _topic("debezium", tag, table))
    insert = f"INSERT INTO {table} (run, sent) VALUES (%s, extract(epoch from clock_timestamp()))"
    out: dict[str, Any] = {}
    for run_no, peer in enumerate(_order(turn)):
        if peer == "tributary":  # its slot made now: no backlog of the other peer's rows
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (tag,))
            run = tributary(_tributary_config(work / f"{tag}.toml", dsn, work, tag, table, "never", br.bootstraps))
        else:
            run = debezium(dsn, br.bootstraps, work, tag, table, "no_data", wait_ready=True)
        ready = _streaming_started(work, tag) if peer == "tributary" else (lambda: True)
        out[peer] = _latency_one(dsn, br, run, ready, _topic(peer, tag, table), insert, run_no, seconds, tps)
    _drop(dsn, [tag, f"dbz_{tag}"], table)
    return out


def _latency_one(
    dsn: str,
    br: Broker,
    run: contextlib.AbstractContextManager[int],
    ready: Callable[[], bool],
    topic: str,
    insert: str,
    run_no: int,
    seconds: float,
    tps: int,
) -> dict[str, float]:
    """One peer's latency: started, its first row seen, then the paced rows (marked `run_no`) while
    a thread reads the topic; p50/p99 of commit clock → seen, once every row sent was seen."""
    latencies: dict[int, float] = {}

    def seen(value: bytes) -> None:
        after = orjson.loads(value).get("after")
        if after and after.get("run") == run_no:
            latencies.setdefault(after["id"], time.time() - float(after["sent"]))

    watch = Watch(br.bootstraps, topic, seen)
    stop = threading.Event()
    reader = threading.Thread(target=lambda: _poll_until(watch, stop))
    try:
        with run:
            _wait(ready, watch, "the peer to stream")
            base = watch.changes
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(insert, (-1,))
            _wait(lambda: watch.changes > base, watch, "the peer's first row")
            reader.start()
            _paced(dsn, insert, min(3.0, seconds), tps, -1)  # warm-up at the same pace, not measured
            sent = _paced(dsn, insert, seconds, tps, run_no)
            deadline = time.perf_counter() + 600
            while len(latencies) < sent and time.perf_counter() < deadline and reader.is_alive():
                time.sleep(0.05)  # the reader's progress is what is waited on
    finally:
        stop.set()
        if reader.is_alive():
            reader.join()
        watch.close()
    if len(latencies) < sent:
        raise RuntimeError(f"{sent} rows sent, {len(latencies)} seen")
    lat = sorted(v * 1000 for v in latencies.values())
    return {"sent": sent, "tps": sent / seconds, "p50_ms": lat[len(lat) // 2], "p99_ms": lat[int(len(lat) * 0.99)]}


def _paced(dsn: str, insert: str, seconds: float, tps: int, run_no: int) -> int:
    """`tps` one-row transactions a second on `WRITERS` connections (one commit's fsync per
    connection at a time would cap a single one below the pace on a loaded disk); how many sent."""
    with ThreadPoolExecutor(WRITERS) as pool:
        futures = [
            pool.submit(paced_writes, dsn, insert, seconds, max(1, tps // WRITERS), lambda _n: (run_no,))
            for _ in range(WRITERS)
        ]
        return sum(f.result() for f in futures)


def _poll_until(watch: Watch, stop: threading.Event) -> None:
    while not stop.is_set():
        watch.poll()


def _wait(done: Callable[[], bool], watch: Watch, what: str, ceiling: float = 600) -> None:
    """Poll the watch until `done` (a generous ceiling: the machine is shared)."""
    start = time.perf_counter()
    while not done():
        watch.poll()
        if time.perf_counter() - start > ceiling:
            raise RuntimeError(f"gave up waiting for {what}")


# -- the whole comparison ------------------------------------------------------------------------


def _median(runs: list[dict[str, Any]], peer: str, key: str) -> float:
    return round(float(statistics.median(r[peer][key] for r in runs)), 3)


def _summary(runs: list[dict[str, Any]], higher_better: str | None) -> dict[str, Any]:
    """Medians of each peer's figures, tributary ÷ Debezium of those medians, and per run."""
    if not runs:
        return {}
    keys = list(runs[0]["tributary"])
    med = {peer: {k: _median(runs, peer, k) for k in keys} for peer in ("tributary", "debezium")}
    ratios = {k: round(med["tributary"][k] / med["debezium"][k], 3) for k in keys if med["debezium"][k]}
    out: dict[str, Any] = {"runs": runs, "median": med, "ratio_of_medians": ratios}
    if higher_better:
        out["ratio_per_run"] = [round(r["tributary"][higher_better] / r["debezium"][higher_better], 3) for r in runs]
    return out


def compare(
    dsn: str,
    work: Path,
    *,
    rows: int,
    snapshot_rows: int,
    repeat: int,
    latency_seconds: float,
    tps: int,
    skip: set[str],
    server_cpu: Callable[[], float],
    debezium_settings: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Every measure `repeat` times, the order alternating; the JSON document's body."""
    DEBEZIUM_SETTINGS.clear()
    DEBEZIUM_SETTINGS.update(debezium_settings or {})
    if shutil.which("java") is None:
        raise SystemExit("bench: --peer debezium needs java (Kafka Connect and the broker run on the JVM)")
    loads: list[tuple[float, float, float]] = [os.getloadavg()]
    with broker(work) as br:
        counters = Counters(server_cpu, br.cpu_s)
        streams = (
            [] if "streaming" in skip else [bench_streaming(dsn, br, work, rows, t, counters) for t in range(repeat)]
        )
        loads.append(os.getloadavg())
        snaps = (
            []
            if "snapshot" in skip
            else [bench_snapshot(dsn, br, work, snapshot_rows, t, counters) for t in range(repeat)]
        )
        loads.append(os.getloadavg())
        lat = (
            [] if "latency" in skip else [bench_latency(dsn, br, work, latency_seconds, tps, t) for t in range(repeat)]
        )
        loads.append(os.getloadavg())
    return {
        "peer": "debezium",
        "debezium_settings_changed": dict(DEBEZIUM_SETTINGS),
        "streaming": {"rows": rows, **_summary(streams, "changes_per_s")},
        "snapshot": {"rows": snapshot_rows, **_summary(snaps, "rows_per_s")},
        "latency": {"tps": tps, "seconds": latency_seconds, **_summary(lat, "p99_ms")},
        "load_average_1m": [round(x[0], 2) for x in loads],
        "goal": "tributary ≥ 2× Debezium's changes/s and rows/s, p99 no worse",
        "note": "ratios are tributary ÷ Debezium; rates are from each process's start (JVM start "
        "included) to the last change visible read_committed; steady_* from its first change visible",
    }
