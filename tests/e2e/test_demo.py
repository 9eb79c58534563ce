"""`tributary demo` as a user runs it: everything on the embedded default, then a summary.

While it runs, the user does what it suggests (a rebuild through the API, as the console's button
does): the demo's continuous projection loop waits for it and goes on. A stage that fails says so at
once on stderr and in `/healthz` (the console shows it), and the demo exits 1."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.e2e.test_console import _browser, _wait
from tests.waiting import Stalled, run_process, size_of, wait_exit, wait_progress
from tributary.api.devdb.embedded import EmbeddedPostgres, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]  # Spark on a slow machine

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from tributary.api.cli.main import main; main()"]


def _pg_dir(tmp_path: Path) -> Path:
    """Where the demo run in `tmp_path` keeps its cluster: its own directory, `.tributary/demo`."""
    return tmp_path / ".tributary" / "demo" / "pg"


@contextmanager
def _demo(tmp_path: Path, duration: int | None) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    """`tributary demo [--duration N]` in the background, in `tmp_path`, in a session of its own
    (so that what it leaves running can be found): (process, stdout file, stderr file)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIBUTARY_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["TRIBUTARY_API__PORT"] = str(free_port())  # not 8000, which demos run at once would share
    out, err = tmp_path / "demo.out", tmp_path / "demo.err"
    with out.open("w") as o, err.open("w") as e:
        args = ["demo"] if duration is None else ["demo", "--duration", str(duration)]
        proc = subprocess.Popen(
            [*CLI, *args], cwd=tmp_path, env=env, stdout=o, stderr=e, text=True, start_new_session=True
        )
    try:
        yield proc, out, err
    finally:
        if proc.poll() is None:
            proc.kill()
            wait_exit(proc, what="the killed demo")
        _kill_session(proc.pid)
        run_process([*CLI, "pg", "down", "--data-dir", str(_pg_dir(tmp_path))], what="pg down", cwd=ROOT)


def _session_processes(sid: int) -> list[str]:
    """The command lines of the processes still in session `sid` (the demo's children: Spark's
    JVM, its Python workers)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[3]) == sid and fields[0] != "Z":  # after ") ": state, ppid, pgrp, session
            found.append(cmdline.strip())
    return found


def _kill_session(sid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sid, signal.SIGKILL)


def _session_cpu(sid: int) -> int:
    """CPU ticks the processes of session `sid` used so far: moves while the demo works (Spark's
    JVM starting prints nothing for a long while on a slow machine)."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[3]) == sid:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks


def _demo_progress(proc: subprocess.Popen[str], out: Path) -> Any:
    """What moves while the demo works or stops: its output, its processes and their CPU time."""
    return size_of(out, out.with_suffix(".err")), tuple(_session_processes(proc.pid)), _session_cpu(proc.pid)


def _until(predicate: Any, timeout: float, what: str, proc: subprocess.Popen[str], err: Path) -> Any:
    """`predicate()`'s first true value; `timeout` is how long the demo may make no progress."""
    found: list[Any] = []

    def done() -> bool:
        found[:] = [predicate()]
        assert found[0] or proc.poll() is None, f"the demo exited while waiting for {what}: {err.read_text()}"
        return bool(found[0])

    try:
        wait_progress(
            done, lambda: _demo_progress(proc, err.with_suffix(".out")), what=what, stall=max(timeout, 120), poll=0.5
        )
    except Stalled as stalled:
        raise AssertionError(f"{stalled}: {err.read_text()}") from None
    return found[0]


def _exit(proc: subprocess.Popen[str], out: Path, what: str) -> None:
    """Wait for the demo to exit while it keeps stopping things (output, processes, CPU)."""
    wait_exit(proc, what=what, progress=lambda: _demo_progress(proc, out), stall=300)


def _url(out: Path) -> str | None:
    m = re.search(r"console\s+(http://127\.0\.0\.1:\d+)/", out.read_text())
    return m.group(1) if m else None


def _get(url: str) -> Any:
    try:
        r = httpx.get(url, timeout=30)
    except httpx.TransportError:
        return None
    return r.json() if r.status_code == 200 else None


def test_demo_runs_end_to_end_through_a_rebuild_and_reports_work(tmp_path: Path) -> None:
    with _demo(tmp_path, None) as (proc, out, err):
        base = _until(lambda: _url(out), 180, "the console URL", proc, err)

        def balances() -> dict[str, Any] | None:
            rows = _get(base + "/projections") or []
            return next((p for p in rows if p["name"] == "account_balances" and p["build"] is not None), None)

        _until(balances, 180, "a first projection run", proc, err)
        sources = _get(base + "/sources") or []
        assert "shop" in [s["name"] for s in sources], sources
        # the rebuild the demo suggests, as the console's button sends it
        r = httpx.post(base + "/projections/account_balances/rebuild", timeout=30)
        assert r.status_code == 202, r.text
        rebuild = f"{base}/rebuilds/{r.json()['id']}"
        done = _until(lambda: (b := _get(rebuild)) and b["state"] != "running" and b, 240, "the rebuild", proc, err)
        assert done["state"] == "done" and done["stage"] == "done", done
        # the demo's loop goes on over the new build: it reads the bank's new events
        rebuilt = _until(lambda: (p := balances()) and p["build"] == done["build"] and p, 60, "the swap", proc, err)
        _until(lambda: (p := balances()) and p["records"] > rebuilt["records"], 120, "a run after", proc, err)
        assert (_get(base + "/healthz") or {}).get("problems") is None
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        _exit(proc, out, "the demo to stop after Ctrl-C")
    stdout, stderr = out.read_text(), err.read_text()
    assert proc.returncode == 0, stdout + stderr
    summary = re.search(
        r"shop transactions=([\d,]+); records in log=([\d,]+) .*accounts opened=(\d+), commands accepted=([\d,]+) "
        r".*projection runs=([\d,]+), rows written=([\d,]+)",
        stdout,
    )
    assert summary, stdout
    transactions, records, accounts, commands, runs, rows = (int(g.replace(",", "")) for g in summary.groups())
    assert transactions > 10 and records > transactions, stdout
    assert accounts == 4 and commands > 5, stdout
    assert runs >= 1 and rows > 0, stdout
    for topic in ("customers", "products", "orders", "order_items"):
        assert f"shop.public.{topic}" in stdout  # as `tributary log cat shop.public.orders` in the README
    assert "events.account" in stdout
    assert "failed" not in stdout and "tributary demo:" not in stderr, stdout + stderr
    assert "stopped the embedded Postgres" in stdout


def test_a_failing_stage_shows_at_once_and_the_demo_exits_1(tmp_path: Path) -> None:
    with _demo(tmp_path, 45) as (proc, out, err):
        base = _until(lambda: _url(out), 180, "the console URL", proc, err)
        shop = EmbeddedPostgres(_pg_dir(tmp_path)).dsn("shop")
        with psycopg.connect(shop, autocommit=True) as conn:  # the workload's table is gone
            conn.execute("ALTER TABLE orders RENAME TO orders_elsewhere")
        line = _until(lambda: re.search(r"tributary demo: shop failed: .*", err.read_text()), 30, "stderr", proc, err)
        assert "orders" in line.group(0), line.group(0)
        problems = _until(lambda: (_get(base + "/healthz") or {}).get("problems"), 10, "/healthz", proc, err)
        assert "shop" in problems, problems
        driver = _browser(tmp_path / "chromium-profile")  # and the console says it
        try:
            driver.get(base + "/")
            _wait(driver, lambda d: "shop failed" in d.find_element("id", "problems").text, "the problem")
        finally:
            driver.quit()
        _exit(proc, out, "the demo to exit after its failed stage")
    assert proc.returncode == 1, out.read_text() + err.read_text()
    assert "shop failed" in out.read_text()  # and again in the summary


@pytest.mark.parametrize(
    ("signum", "when"),
    [(signal.SIGTERM, "projecting"), (signal.SIGINT, "starting Spark")],
    ids=["SIGTERM-projecting", "SIGINT-starting-spark"],
)
def test_a_signal_stops_everything_with_the_summary_and_blames_no_stage(tmp_path: Path, signum: int, when: str) -> None:
    """`timeout 900 make demo` sends SIGTERM; Ctrl-C, SIGINT. Either ends it within seconds, with
    the summary and nothing of the demo left running: during a projection pass (cancelled, never
    reported as a failure), or while Spark's JVM is still starting."""
    with _demo(tmp_path, None) as (proc, out, err):
        base = _until(lambda: _url(out), 180, "the console URL", proc, err)
        cluster = EmbeddedPostgres(_pg_dir(tmp_path))
        assert cluster.is_running()

        def projected() -> bool:
            rows = _get(base + "/projections") or []
            return any(p["build"] is not None for p in rows)

        def jvm() -> bool:
            return any("java" in c for c in _session_processes(proc.pid))

        if when == "projecting":
            _until(projected, 240, "a first projection run (Spark's JVM up)", proc, err)
        _until(jvm, 240, "Spark's JVM", proc, err)
        proc.send_signal(signum)
        _exit(proc, out, "the demo to stop on the signal")
        with contextlib.suppress(Stalled):  # children exit a moment after their parent: wait for that
            wait_progress(
                lambda: not _session_processes(proc.pid),
                lambda: tuple(_session_processes(proc.pid)),
                what="the demo's children to exit",
                stall=60,
            )
        left = _session_processes(proc.pid)
        running = cluster.is_running()
    stdout, stderr = out.read_text(), err.read_text()
    assert proc.returncode == 0, stdout + stderr
    assert "summary shop transactions=" in stdout, stdout
    assert "failed" not in stdout and "tributary demo:" not in stderr, stdout + stderr
    assert "Traceback" not in stderr, stderr
    assert "stopped the embedded Postgres" in stdout, stdout
    assert not running and not left, left
