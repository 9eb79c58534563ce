"""`tributary demo` as a user runs it: everything on the embedded default, then a summary.

While it runs, the user does what it suggests (a rebuild through the API, as the console's button
does): the demo's continuous projection loop waits for it and goes on. A stage that fails says so at
once on stderr and in `/healthz` (the console shows it), and the demo exits 1."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.e2e.test_console import _browser, _wait
from tributary.api.devdb.embedded import EmbeddedPostgres

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-c", "from tributary.api.cli.main import main; main()"]


@contextmanager
def _demo(tmp_path: Path, duration: int | None) -> Iterator[tuple[subprocess.Popen[str], Path, Path]]:
    """`tributary demo [--duration N]` in the background: (process, stdout file, stderr file)."""
    env = {
        **os.environ,
        "TRIBUTARY_PG_DATA_DIR": str(tmp_path / "pg"),
        "TRIBUTARY_LOG__ROOT": str(tmp_path / "log"),
        "PYTHONUNBUFFERED": "1",
    }
    out, err = tmp_path / "demo.out", tmp_path / "demo.err"
    with out.open("w") as o, err.open("w") as e:
        args = ["demo"] if duration is None else ["demo", "--duration", str(duration)]
        proc = subprocess.Popen([*CLI, *args], cwd=tmp_path, env=env, stdout=o, stderr=e, text=True)
    try:
        yield proc, out, err
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=120)
        subprocess.run(
            [*CLI, "pg", "down", "--data-dir", str(tmp_path / "pg")], cwd=ROOT, capture_output=True, timeout=120
        )


def _until(predicate: Any, timeout: float, what: str, proc: subprocess.Popen[str], err: Path) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        assert proc.poll() is None, f"the demo exited while waiting for {what}: {err.read_text()}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {err.read_text()}")


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
        proc.wait(timeout=300)
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
        shop = EmbeddedPostgres(tmp_path / "pg").dsn("shop")
        with psycopg.connect(shop, autocommit=True) as conn:  # the workload's table is gone
            conn.execute("ALTER TABLE orders RENAME TO orders_elsewhere")
        line = _until(lambda: re.search(r"tributary demo: shop failed: .*", err.read_text()), 30, "stderr", proc, err)
        assert "orders" in line.group(0), line.group(0)
        problems = _until(lambda: (_get(base + "/healthz") or {}).get("problems"), 10, "/healthz", proc, err)
        assert "shop" in problems, problems
        driver = _browser(tmp_path / "chromium-profile")  # and the console says it
        try:
            driver.get(base + "/")
            _wait(driver, lambda d: "shop failed" in d.find_element("id", "problems").text, 20, "the problem")
        finally:
            driver.quit()
        proc.wait(timeout=300)
    assert proc.returncode == 1, out.read_text() + err.read_text()
    assert "shop failed" in out.read_text()  # and again in the summary
