"""Capture benchmark: tributary against pg_recvlogical (and psql's COPY) in the same run.

Prints one JSON document. Ratios, not single timings, are the result: the machine is noisy.

    .venv/bin/python bench/capture.py                 # 1M-row backlog, 2M-row snapshot
    .venv/bin/python bench/capture.py --rows 200000 --snapshot-rows 400000 --repeat 1
    .venv/bin/python bench/capture.py --compare-to /work/baseline   # also that checkout's capture, alternating
    .venv/bin/python bench/capture.py --compare-to /work/baseline --source-setting transaction_metadata=true
    .venv/bin/python bench/capture.py --skip streaming,snapshot,latency --chunked   # chunked vs consistent, kill -9 at 90 %
    .venv/bin/python bench/capture.py --skip streaming,snapshot,latency --resnapshot --key-check-rows 300000
    .venv/bin/python bench/capture.py --peer debezium --rows 200000 --snapshot-rows 500000 --repeat 3

`--compare-to CHECKOUT` runs another checkout's capture (its `.venv/bin/tributary`) on
the same table right after this one's in each repeat, alternating which goes first, and reports
both rates and the ratio this/that.

`--peer debezium` measures tributary on the Kafka backend against Debezium's PostgreSQL connector
(Kafka Connect standalone) on one real broker instead (bench/_peer_debezium.py): streaming,
snapshot and latency as above, alternating who goes first; `--skip` applies.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pg_sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._compiled import add_allow_python, require_compiled  # noqa: E402
from bench._paced import paced_writes  # noqa: E402
from tributary.api.devdb.embedded import EmbeddedPostgres  # noqa: E402
from tributary.capture.database.catalog import list_tables  # noqa: E402
from tributary.capture.decoding.lsn import Lsn  # noqa: E402
from tributary.capture.decoding.wal2json import WAL2JSON_OPTIONS  # noqa: E402
from tributary.capture.snapshot.chunked import check_query, context_key, key_lines  # noqa: E402
from tributary.capture.status import read_status  # noqa: E402
from tributary.log.local import Log  # noqa: E402

# `--source-setting`: `[[sources]]` lines for this checkout's captures only (what a setting costs, with --compare-to)
_THIS_SETTINGS = ""


def _config(path: Path, dsn: str, log_root: Path, slot: str, snapshot: str, include: str, extra: str = "") -> Path:
    path.write_text(
        f'[log]\nroot = "{log_root}"\npartitions = 4\n\n'
        f'[[sources]]\nname = "b"\ndsn = "{dsn}"\nslot = "{slot}"\ninclude = ["{include}"]\nsnapshot = "{snapshot}"\n'
        + extra
    )
    return path


_CLI = "from tributary.api.cli.main import main; main()"


def _spawn(config: Path, checkout: Path | None = None) -> subprocess.Popen[bytes]:
    """This checkout's capture, or `checkout`'s through its venv's `tributary` console script
    (whatever the layout its CLI entry has there)."""
    cmd = [sys.executable, "-c", _CLI] if checkout is None else [str(checkout / ".venv" / "bin" / "tributary")]
    return subprocess.Popen(
        [*cmd, "capture", "--config", str(config)],
        cwd=ROOT if checkout is None else checkout,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _position(log_root: Path) -> Lsn | None:
    try:
        with Log.open(log_root) as log:
            pos = log.positions().get("b")
    except Exception:  # noqa: BLE001 - the log may not exist yet while capture starts
        return None
    return None if pos is None else Lsn.parse(pos)


def _peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _run_until(
    config: Path, log_root: Path, target: Lsn, timeout: float = 1800, checkout: Path | None = None
) -> tuple[float, float]:
    """Start capture (this checkout's, or `checkout`'s), wait until the manifest covers `target`;
    (seconds, peak RSS MB)."""
    start = time.perf_counter()
    proc = _spawn(config, checkout)
    peak = 0.0
    try:
        while True:
            peak = max(peak, _peak_rss_mb(proc.pid))
            pos = _position(log_root)
            if pos is not None and pos >= target:
                return time.perf_counter() - start, peak
            if proc.poll() is not None:
                raise RuntimeError(f"capture exited: {proc.stderr.read().decode() if proc.stderr else ''}")
            if time.perf_counter() - start > timeout:
                raise RuntimeError("capture did not catch up in time")
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _current_lsn(dsn: str) -> Lsn:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return Lsn.parse(row[0])


def _captures(
    cluster: EmbeddedPostgres,
    work: Path,
    name: str,
    dsn: str,
    slot: str,
    snapshot: str,
    include: str,
    target: Lsn,
    compare_to: Path | None,
    turn: int,
) -> dict[str, float]:
    """This checkout's capture (and `compare_to`'s, on its own slot `slot` + "_old"), alternating
    which goes first by `turn`: seconds, client CPU (of which kernel), server CPU and peak RSS of each."""
    cluster_cpu = functools.partial(_server_cpu, cluster)
    runs: list[tuple[str, Path | None, str]] = [("tributary", None, slot)]
    if compare_to is not None:
        runs.append(("old", compare_to, slot + "_old"))
        if turn % 2:
            runs.reverse()
    out: dict[str, float] = {}
    for label, checkout, slot_name in runs:
        log_root = work / f"log-{name}-{label}"
        extra = _THIS_SETTINGS if checkout is None else ""
        config = _config(work / f"{name}-{label}.toml", dsn, log_root, slot_name, snapshot, include, extra)
        c0, s0, k0 = _children_cpu(), cluster_cpu(), _children_sys()
        seconds, rss = _run_until(config, log_root, target, checkout=checkout)
        out[f"{label}_s"] = seconds
        out[f"{label}_client_cpu_s"] = _children_cpu() - c0
        out[f"{label}_client_sys_cpu_s"] = _children_sys() - k0
        out[f"{label}_server_cpu_s"] = cluster_cpu() - s0
        out[f"{label}_peak_rss_mb"] = rss
        shutil.rmtree(log_root, ignore_errors=True)
    return out


def _compare(rows: int, runs: dict[str, float], compare_to: Path | None, unit: str) -> dict[str, float]:
    """The old checkout's rate, CPU and RSS, and this/that: rate ratio (> 1: this one is faster)."""
    if compare_to is None:
        return {}
    us = 1e6 / rows
    return {
        f"old_{unit}_per_s": rows / runs["old_s"],
        "new_vs_old_rate_ratio": runs["old_s"] / runs["tributary_s"],
        "old_client_cpu_us": runs["old_client_cpu_s"] * us,
        "old_client_sys_cpu_us": runs["old_client_sys_cpu_s"] * us,
        "old_server_cpu_us": runs["old_server_cpu_s"] * us,
        "old_peak_rss_mb": runs["old_peak_rss_mb"],
    }


def bench_streaming(
    cluster: EmbeddedPostgres, dsn: str, rows: int, work: Path, compare_to: Path | None = None, turn: int = 0
) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS stream_t; CREATE TABLE stream_t (id bigserial PRIMARY KEY, a int, b text, c timestamptz)"
        )
        for slot in ("bench_recv", "bench_trib", *(["bench_trib_old"] if compare_to else [])):
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            )
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (slot,))
        step = 100_000
        for lo in range(0, rows, step):
            n = min(step, rows - lo)
            conn.execute(
                "INSERT INTO stream_t (a, b, c) SELECT g, md5(g::text) || md5((g+1)::text) || 'xxxxxxxx', now() FROM generate_series(1, %s) g",
                (n,),
            )
    end = _current_lsn(dsn)
    # Baseline: pg_recvlogical with the same wal2json options, writing a file.
    opts = [arg for k, v in WAL2JSON_OPTIONS.items() for arg in ("-o", f"{k}={v}")]
    out = work / "recv.jsonl"
    c0, s0, t0 = _children_cpu(), _server_cpu(cluster), time.perf_counter()
    subprocess.run(
        [
            str(cluster.bin_dir / "pg_recvlogical"),
            "-d",
            dsn,
            "--slot",
            "bench_recv",
            "--start",
            "-E",
            str(end),
            "-f",
            str(out),
            "--no-loop",
            *opts,
        ],
        check=True,
        capture_output=True,
    )
    recv_s = time.perf_counter() - t0
    recv_client, recv_server = _children_cpu() - c0, _server_cpu(cluster) - s0
    runs = _captures(cluster, work, "stream", dsn, "bench_trib", "never", "public.stream_t", end, compare_to, turn)
    trib_s, rss = runs["tributary_s"], runs["tributary_peak_rss_mb"]
    trib_client, trib_server = runs["tributary_client_cpu_s"], runs["tributary_server_cpu_s"]
    trib_sys = runs["tributary_client_sys_cpu_s"]
    us = 1e6 / rows
    out.unlink(missing_ok=True)
    if compare_to is not None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot('bench_trib_old')")
    return {
        **_compare(rows, runs, compare_to, "changes"),
        "old_ratio": recv_s / runs["old_s"] if compare_to else 0.0,
        "pg_recvlogical_changes_per_s": rows / recv_s,
        "tributary_changes_per_s": rows / trib_s,
        "ratio": recv_s / trib_s,
        "tributary_peak_rss_mb": rss,
        # CPU per change (µs): each client process (tributary's start-up included) and the whole
        # cluster (mostly the walsender decoding), from rusage and /proc
        "pg_recvlogical_client_cpu_us": recv_client * us,
        "pg_recvlogical_server_cpu_us": recv_server * us,
        "tributary_client_cpu_us": trib_client * us,
        "tributary_client_sys_cpu_us": trib_sys * us,
        "tributary_server_cpu_us": trib_server * us,
    }


def bench_big_tx(dsn: str, rows: int, work: Path) -> dict[str, float]:
    """One transaction of `rows` inserts: capture must stream it through in bounded memory."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS big_t; CREATE TABLE big_t (id bigserial PRIMARY KEY, a int, b text, c timestamptz)"
        )
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'bench_big'"
        )
        conn.execute("SELECT pg_create_logical_replication_slot('bench_big', 'wal2json')")
        conn.execute(
            "INSERT INTO big_t (a, b, c) SELECT g, md5(g::text) || md5((g+1)::text) || 'xxxxxxxx', now() FROM generate_series(1, %s) g",
            (rows,),
        )  # autocommit: one statement, one transaction
    end = _current_lsn(dsn)
    log_root = work / "log-big"
    config = _config(work / "big.toml", dsn, log_root, "bench_big", "never", "public.big_t")
    trib_s, rss = _run_until(config, log_root, end)
    shutil.rmtree(log_root, ignore_errors=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('bench_big')")
        conn.execute("DROP TABLE big_t")
    return {"rows": rows, "tributary_changes_per_s": rows / trib_s, "tributary_peak_rss_mb": rss, "target_rss_mb": 300}


_TICK = os.sysconf("SC_CLK_TCK")


def _server_cpu(cluster: EmbeddedPostgres) -> float:
    """CPU seconds of the whole PostgreSQL cluster so far: the postmaster with its reaped
    backends (cutime/cstime) and every live child."""
    try:
        pid = int((cluster.pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    total = 0.0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(proc.name) == pid:
            total += sum(int(f) for f in fields[11:15]) / _TICK
        elif int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _children_sys() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime


def bench_snapshot(
    cluster: EmbeddedPostgres, dsn: str, rows: int, work: Path, compare_to: Path | None = None, turn: int = 0
) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS snap_t; CREATE TABLE snap_t (id bigserial PRIMARY KEY, a int, b text, c timestamptz)"
        )
        conn.execute(
            "INSERT INTO snap_t (a, b, c) SELECT g, md5(g::text) || md5((g+1)::text), now() FROM generate_series(1, %s) g",
            (rows,),
        )
        conn.execute("VACUUM ANALYZE snap_t")
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
            " WHERE slot_name IN ('bench_snap', 'bench_snap_old')"
        )
    c0, s0, t0 = _children_cpu(), _server_cpu(cluster), time.perf_counter()
    subprocess.run(
        [shutil.which("psql") or "psql", dsn, "-c", r"\copy snap_t to /dev/null"], check=True, capture_output=True
    )
    psql_s = time.perf_counter() - t0
    psql_client, psql_server = _children_cpu() - c0, _server_cpu(cluster) - s0
    runs = _captures(cluster, work, "snap", dsn, "bench_snap", "initial", "public.snap_t", Lsn(1), compare_to, turn)
    trib_s, rss = runs["tributary_s"], runs["tributary_peak_rss_mb"]
    trib_client, trib_server = runs["tributary_client_cpu_s"], runs["tributary_server_cpu_s"]
    trib_sys = runs["tributary_client_sys_cpu_s"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('bench_snap')")
        if compare_to is not None:
            conn.execute("SELECT pg_drop_replication_slot('bench_snap_old')")
    us = 1e6 / rows
    return {
        **_compare(rows, runs, compare_to, "rows"),
        "psql_copy_rows_per_s": rows / psql_s,
        "tributary_rows_per_s": rows / trib_s,
        "ratio": psql_s / trib_s,
        "tributary_peak_rss_mb": rss,
        # CPU per row (µs): the client process (start-up included) and the whole cluster
        "psql_client_cpu_us": psql_client * us,
        "psql_server_cpu_us": psql_server * us,
        "tributary_client_cpu_us": trib_client * us,
        "tributary_client_sys_cpu_us": trib_sys * us,  # of which in the kernel (writes, fsync)
        "tributary_server_cpu_us": trib_server * us,
    }


def _snapshot_state(log_root: Path, topic: str) -> tuple[bool, int]:
    """(the snapshot is committed, records committed in `topic`): the source's snapshot context
    in the manifest (capture/snapshot/chunked.py) has no table pending, with the table done; either method
    commits it with the snapshot's last rows."""
    try:
        with Log.open(log_root) as log:
            if topic not in log.topics():
                return False, 0
            context = log.positions().get(context_key("b"))
            done = False
            if context is not None:
                doc = json.loads(context)
                done = not doc.get("pending") and topic.split(".", 1)[1] in doc.get("done", [])
            return done, sum(log.end_offsets(topic))
    except Exception:  # noqa: BLE001 - the log may not exist yet while capture starts
        return False, 0


def _snapshot_until(
    config: Path, log_root: Path, topic: str, *, kill_at: int | None = None, timeout: float = 1800
) -> tuple[float, int]:
    """Start capture, wait until its snapshot's last record is committed; (seconds, records in the
    topic). `kill_at`: instead kill -9 it once that many records are committed; (seconds, records)."""
    start = time.perf_counter()
    proc = _spawn(config)
    try:
        while True:
            done, count = _snapshot_state(log_root, topic)
            if kill_at is not None and count >= kill_at:
                proc.kill()
                return time.perf_counter() - start, count
            if done:
                return time.perf_counter() - start, count
            if proc.poll() is not None:
                raise RuntimeError(f"capture exited: {proc.stderr.read().decode() if proc.stderr else ''}")
            if time.perf_counter() - start > timeout:
                raise RuntimeError("the snapshot did not finish in time")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=60)


def bench_chunked(
    cluster: EmbeddedPostgres, dsn: str, rows: int, work: Path, chunk_rows: int | None, turn: int
) -> dict[str, float]:
    """The same table snapshotted both ways in one repeat (which goes first alternates), then a
    chunked snapshot killed -9 at 90 % of its rows and restarted: what the crash costs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS snap_t; CREATE TABLE snap_t (id bigserial PRIMARY KEY, a int, b text, c timestamptz)"
        )
        conn.execute(
            "INSERT INTO snap_t (a, b, c) SELECT g, md5(g::text) || md5((g+1)::text), now() FROM generate_series(1, %s) g",
            (rows,),
        )
        conn.execute("VACUUM ANALYZE snap_t")
    chunked = 'snapshot_method = "chunked"\n' + (f"snapshot_chunk_rows = {chunk_rows}\n" if chunk_rows else "")
    topic = "b.public.snap_t"

    def run(label: str, extra: str, kill_at: int | None = None, log_root: Path | None = None) -> tuple[float, int]:
        root = log_root or work / f"log-{label}"
        slot = f"bench_{label}"
        config = _config(work / f"{label}.toml", dsn, root, slot, "initial", "public.snap_t", extra)
        return _snapshot_until(config, root, topic, kill_at=kill_at)

    def settle() -> None:
        """Untimed, before each timed run: the previous run's log written out (its dirty pages
        would slow the next run's fsyncs: the run that went second was ~2x slower) and a checkpoint."""
        os.sync()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CHECKPOINT")

    def drop(*labels: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for label in labels:
                conn.execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                    (f"bench_{label}",),
                )
                shutil.rmtree(work / f"log-{label}", ignore_errors=True)

    drop("consistent", "chunked", "killed")
    out: dict[str, float] = {}
    order = [("consistent", ""), ("chunked", chunked)]
    for label, extra in order if turn % 2 == 0 else reversed(order):
        settle()
        c0, s0 = _children_cpu(), _server_cpu(cluster)
        seconds, count = run(label, extra)
        out[f"{label}_s"] = seconds
        out[f"{label}_records"] = count
        out[f"{label}_client_cpu_us"] = (_children_cpu() - c0) * 1e6 / rows  # per row, start-up included
        out[f"{label}_server_cpu_us"] = (_server_cpu(cluster) - s0) * 1e6 / rows
        drop(label)
    # kill -9 once 90 % of the rows are committed, restart, time what is left
    settle()
    killed_s, at_kill = run("killed", chunked, kill_at=int(rows * 0.9))
    settle()
    finish_s, final = run("killed", chunked, log_root=work / "log-killed")
    status = read_status(work / "log-killed") or {}  # the restarted capture's, written as it stopped
    read_after = sum(s.get("snapshot_rows_read", 0) for s in status.get("sources", []))
    committed_rows = at_kill - 4  # each of the 4 partitions starts with the table's schema record
    drop("consistent", "chunked", "killed")
    rate = rows / out["chunked_s"]
    remaining = out["chunked_records"] - at_kill  # what an uninterrupted run still had to write
    return {
        "consistent_rows_per_s": rows / out["consistent_s"],
        "chunked_rows_per_s": rate,
        "ratio": out["consistent_s"] / out["chunked_s"],
        "consistent_s": out["consistent_s"],
        "chunked_s": out["chunked_s"],
        "consistent_client_cpu_us": out["consistent_client_cpu_us"],
        "chunked_client_cpu_us": out["chunked_client_cpu_us"],
        "consistent_server_cpu_us": out["consistent_server_cpu_us"],
        "chunked_server_cpu_us": out["chunked_server_cpu_us"],
        "killed_at_records": at_kill,
        "killed_after_s": killed_s,
        "rows_read_after_restart": read_after,
        "rows_reread": read_after - (rows - committed_rows),  # read before the crash, not committed, read again
        "records_duplicated": final - out["chunked_records"],  # in the log twice (schema records announced again)
        "finish_after_restart_s": finish_s,
        "remaining_at_uninterrupted_rate_s": remaining / rate,
        "seconds_lost": finish_s - remaining / rate,
    }


def _context(log_root: Path) -> dict[str, Any] | None:
    """The source's chunked-snapshot context as last committed (capture/snapshot/chunked.py), if any."""
    try:
        with Log.open(log_root) as log:
            text = log.positions().get(context_key("b"))
    except Exception:  # noqa: BLE001 - the log may be being created
        return None
    return None if text is None else json.loads(text)


def _resnapshot_until(config: Path, log_root: Path, table: str, timeout: float = 3600) -> tuple[float, float]:
    """Start capture on a log whose slot is gone (`snapshot = "when_needed"`): wait until its
    chunked re-snapshot of `table` is committed whole, key check included; (seconds in all,
    seconds of the key check: from the first commit in phase "absent")."""
    start = time.perf_counter()
    proc = _spawn(config)
    began = False
    absent_at: float | None = None
    try:
        while True:
            ctx = _context(log_root) or {}
            pending = list(ctx.get("pending") or [])
            if table in pending:
                began = True
                if ctx.get("phase") == "absent" and absent_at is None:
                    absent_at = time.perf_counter()
            elif began:
                end = time.perf_counter()
                return end - start, end - (absent_at or end)
            if proc.poll() is not None:
                raise RuntimeError(f"capture exited: {proc.stderr.read().decode() if proc.stderr else ''}")
            if time.perf_counter() - start > timeout:
                raise RuntimeError("the re-snapshot did not finish in time")
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=60)


def bench_resnapshot(cluster: EmbeddedPostgres, dsn: str, rows: int, work: Path) -> dict[str, float]:
    """A chunked first snapshot of a table, then, its slot dropped and 1 % of its rows deleted, the
    `when_needed` re-snapshot of it: every row read again, then every key of its topic checked
    against the table (a delete + tombstone for each key gone). The ratio re-snapshot ÷ first."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS resnap_t; CREATE TABLE resnap_t (id bigserial PRIMARY KEY, a int, b text, c timestamptz)"
        )
        conn.execute(
            "INSERT INTO resnap_t (a, b, c) SELECT g, md5(g::text) || md5((g+1)::text), now() FROM generate_series(1, %s) g",
            (rows,),
        )
        conn.execute("VACUUM ANALYZE resnap_t")
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'bench_resnap'"
        )
    log_root = work / "log-resnap"
    shutil.rmtree(log_root, ignore_errors=True)
    extra = 'snapshot_method = "chunked"\n'
    config = _config(work / "resnap.toml", dsn, log_root, "bench_resnap", "when_needed", "public.resnap_t", extra)
    os.sync()
    c0 = _children_cpu()
    first_s, _ = _snapshot_until(config, log_root, "b.public.resnap_t")
    first_cpu = _children_cpu() - c0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('bench_resnap')")
        deleted = conn.execute("DELETE FROM resnap_t WHERE id % 100 = 0").rowcount
        conn.execute("VACUUM ANALYZE resnap_t")
    os.sync()
    c0 = _children_cpu()
    again_s, check_s = _resnapshot_until(config, log_root, "public.resnap_t")
    again_cpu = _children_cpu() - c0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot('bench_resnap')")
        conn.execute("DROP TABLE resnap_t")
    shutil.rmtree(log_root, ignore_errors=True)
    return {
        "first_s": first_s,
        "resnapshot_s": again_s,
        "ratio": again_s / first_s,
        "key_check_s": check_s,
        "keys_deleted": deleted,
        "first_client_cpu_s": first_cpu,
        "resnapshot_client_cpu_s": again_cpu,
    }


def bench_key_check(dsn: str, rows: int, batch: int) -> dict[str, float]:
    """One batch of the re-snapshot's key check (capture/snapshot/chunked.py `check_query`) against the same
    batch matched as the check once did (IS NOT DISTINCT FROM, which no index serves)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "DROP TABLE IF EXISTS check_t; CREATE TABLE check_t (id int PRIMARY KEY, n numeric(12, 2), note text)"
        )
        conn.execute("INSERT INTO check_t SELECT g, g * 1.5, 'seed' FROM generate_series(1, %s) g", (rows,))
        conn.execute("VACUUM ANALYZE check_t")
        info = list_tables(conn, lambda s, t: (s, t) == ("public", "check_t"))[0]
        step = max(1, rows * 11 // 10 // batch)  # spread over the table, about 1 in 11 past its end
        keys = [f'{{"id":{i}}}' for i in range(1, rows * 11 // 10 + 1, step)][:batch]
        old = pg_sql.SQL(
            "SELECT k FROM unnest(%s::text[]) AS k, LATERAL json_populate_record(NULL::public.check_t, k::json) AS r "
            "WHERE NOT EXISTS (SELECT 1 FROM public.check_t AS x WHERE x.id IS NOT DISTINCT FROM r.id)"
        )
        timings: dict[str, float] = {}
        found: dict[str, int] = {}
        params = {"check": key_lines([k.encode() for k in keys]), "not_distinct": keys}  # as each was sent
        for label, query in (("check", check_query(conn, info)), ("not_distinct", old)):
            t0 = time.perf_counter()
            found[label] = len(conn.execute(query, (params[label],)).fetchall())
            timings[label] = time.perf_counter() - t0
        conn.execute("DROP TABLE check_t")
    if found["check"] != found["not_distinct"]:
        raise RuntimeError(f"the two checks disagree: {found}")
    return {
        "rows": rows,
        "batch": len(keys),
        "absent": found["check"],
        "check_ms": timings["check"] * 1000,
        "not_distinct_ms": timings["not_distinct"] * 1000,
        "speedup": timings["not_distinct"] / timings["check"],
    }


def bench_latency(dsn: str, work: Path, seconds: float, tps: int) -> dict[str, float]:
    """Commit -> committed in the log, at a steady rate: the row carries its commit clock."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS lat_t; CREATE TABLE lat_t (id bigserial PRIMARY KEY, sent double precision)")
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'bench_lat'"
        )
    log_root = work / "log-lat"
    config = _config(work / "lat.toml", dsn, log_root, "bench_lat", "never", "public.lat_t")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('bench_lat', 'wal2json')")
    proc = _spawn(config)
    time.sleep(3)
    seen: dict[int, float] = {}
    stop = threading.Event()

    def follow() -> None:
        offsets: dict[int, int] = {}
        while not stop.is_set():
            try:
                with Log.open(log_root) as log:
                    if "b.public.lat_t" in log.topics():
                        for p in range(log.topics()["b.public.lat_t"].partitions):
                            for rec in log.read("b.public.lat_t", p, offsets.get(p, 0)):
                                offsets[p] = rec.offset + 1
                                if rec.value:
                                    after = json.loads(rec.value).get("after")
                                    if after and "sent" in after:
                                        seen[after["id"]] = time.time() - float(after["sent"])
            except Exception:  # noqa: BLE001 - keep following while the log is being created
                pass
            time.sleep(0.001)

    reader = threading.Thread(target=follow)
    reader.start()
    sent = paced_writes(dsn, "INSERT INTO lat_t (sent) VALUES (extract(epoch from clock_timestamp()))", seconds, tps)
    time.sleep(2)
    stop.set()
    reader.join()
    proc.terminate()
    proc.wait(timeout=60)
    lat = sorted(v * 1000 for v in seen.values())
    shutil.rmtree(log_root, ignore_errors=True)
    return {
        "sent": sent,
        "seen": len(lat),
        "tps": sent / seconds,
        "p50_ms": lat[len(lat) // 2] if lat else float("nan"),
        "p99_ms": lat[int(len(lat) * 0.99)] if lat else float("nan"),
        "note": "includes the reader's own poll (1 ms) and manifest re-read",
    }  # type: ignore[dict-item]


def _run_peer(args: argparse.Namespace, impl: str, cluster: EmbeddedPostgres, work: Path) -> None:
    """`--peer debezium`: the comparison on Kafka; prints and saves its JSON document."""
    from bench._peer_debezium import compare

    try:
        body = compare(
            cluster.dsn(),
            work,
            rows=args.rows,
            snapshot_rows=args.snapshot_rows,
            repeat=args.repeat,
            latency_seconds=args.latency_seconds,
            tps=1000,
            skip=set(filter(None, args.skip.split(","))),
            server_cpu=functools.partial(_server_cpu, cluster),
            debezium_settings=dict(kv.split("=", 1) for kv in args.debezium_set),
        )
    finally:
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)
    result = {"impl": impl, "machine": {"cpus": os.cpu_count()}, **body}
    out = args.out.with_name("capture-debezium.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--snapshot-rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency-seconds", type=float, default=10)
    parser.add_argument("--big-tx-rows", type=int, default=0, help="also capture one transaction of this many rows")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: streaming,snapshot,latency")
    parser.add_argument(
        "--chunked", action="store_true", help="also: consistent vs chunked snapshot, and a kill -9 at 90 %%"
    )
    parser.add_argument("--chunk-rows", type=int, default=None, help="snapshot_chunk_rows (default: capture's)")
    parser.add_argument(
        "--resnapshot",
        action="store_true",
        help="also: a chunked re-snapshot (key check included) against the first snapshot of the table",
    )
    parser.add_argument(
        "--key-check-rows", type=int, default=0, help="also: one 2,000-key batch of the key check on a table this big"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "capture.json")
    parser.add_argument(
        "--compare-to", type=Path, default=None, help="another checkout (with its .venv) to run on the same tables"
    )
    parser.add_argument(
        "--peer",
        choices=["debezium"],
        default=None,
        help="instead: tributary on Kafka against this peer, same broker and tables (bench/_peer_debezium.py)",
    )
    parser.add_argument(
        "--debezium-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --peer debezium: a connector setting instead of the default (repeatable)",
    )
    parser.add_argument(
        "--source-setting",
        action="append",
        default=[],
        metavar="KEY=TOML",
        help="a [[sources]] setting for this checkout's streaming and snapshot runs only, e.g. "
        "transaction_metadata=true (repeatable; with --compare-to: what it costs)",
    )
    add_allow_python(parser)
    args = parser.parse_args()
    if any("=" not in kv for kv in args.source_setting):
        parser.error("--source-setting takes KEY=TOML")
    global _THIS_SETTINGS
    _THIS_SETTINGS = "".join(
        f"{kv.split('=', 1)[0].strip()} = {kv.split('=', 1)[1].strip()}\n" for kv in args.source_setting
    )
    if any("=" not in kv for kv in args.debezium_set):
        parser.error("--debezium-set takes KEY=VALUE")
    impl = require_compiled(args.allow_python)
    compare_to = args.compare_to.resolve() if args.compare_to else None
    work = Path(tempfile.mkdtemp(prefix="tributary-bench-"))
    cluster = EmbeddedPostgres(work / "pg")
    cluster.up()
    dsn = cluster.dsn()
    if args.peer:
        _run_peer(args, impl, cluster, work)
        return
    try:
        skip = set(filter(None, args.skip.split(",")))
        streams = (
            []
            if "streaming" in skip
            else [bench_streaming(cluster, dsn, args.rows, work, compare_to, turn) for turn in range(args.repeat)]
        )
        snaps = (
            []
            if "snapshot" in skip
            else [
                bench_snapshot(cluster, dsn, args.snapshot_rows, work, compare_to, turn) for turn in range(args.repeat)
            ]
        )
        chunked = (
            [
                bench_chunked(cluster, dsn, args.snapshot_rows, work, args.chunk_rows, turn)
                for turn in range(args.repeat)
            ]
            if args.chunked
            else []
        )
        resnapshot = (
            [bench_resnapshot(cluster, dsn, args.snapshot_rows, work) for _ in range(args.repeat)]
            if args.resnapshot
            else []
        )
        key_check = bench_key_check(dsn, args.key_check_rows, 2000) if args.key_check_rows else None
        latency = {} if "latency" in skip else bench_latency(dsn, work, args.latency_seconds, 1000)
        big = bench_big_tx(dsn, args.big_tx_rows, work) if args.big_tx_rows else None
    finally:
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)

    def med(rows: list[dict[str, float]]) -> dict[str, float]:
        return {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]} if rows else {}

    def spread(rows: list[dict[str, float]]) -> dict[str, list[float]]:
        return (
            {k: [round(min(r[k] for r in rows), 3), round(max(r[k] for r in rows), 3)] for k in rows[0]} if rows else {}
        )

    result = {
        "impl": impl,
        "machine": {"cpus": os.cpu_count()},
        "compare_to": str(compare_to) if compare_to else None,
        "streaming": {
            "rows": args.rows,
            "runs": len(streams),
            "median": med(streams),
            "range": spread(streams),
            "ratios": [round(r["ratio"], 3) for r in streams],
            "new_vs_old_rate_ratios": [round(r["new_vs_old_rate_ratio"], 3) for r in streams if compare_to],
            "target_ratio": 0.8,
        },
        "snapshot": {
            "rows": args.snapshot_rows,
            "runs": len(snaps),
            "median": med(snaps),
            "range": spread(snaps),
            "new_vs_old_rate_ratios": [round(r["new_vs_old_rate_ratio"], 3) for r in snaps if compare_to],
            "target_ratio": 0.7,
        },
        "chunked_snapshot": {
            "rows": args.snapshot_rows,
            "chunk_rows": args.chunk_rows,
            "runs": len(chunked),
            "median": med(chunked),
            "range": spread(chunked),
            "ratios": [round(r["ratio"], 3) for r in chunked],
            "target_ratio": 0.8,
        },
        "resnapshot": {
            "rows": args.snapshot_rows,
            "runs": len(resnapshot),
            "median": med(resnapshot),
            "range": spread(resnapshot),
            "ratios": [round(r["ratio"], 3) for r in resnapshot],
            "target_ratio": 3.0,  # re-snapshot ÷ first snapshot (docs/capture.md: 2–3×)
        },
        "key_check": key_check,
        "load_average": os.getloadavg(),
        "latency_1000tps": latency,
        "big_transaction": big,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
