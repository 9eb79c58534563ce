"""`tributary demo` as a user runs it: everything on the embedded default, then a summary."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_end_to_end_and_reports_work(tmp_path: Path) -> None:
    env = {**os.environ, "TRIBUTARY_PG_DATA_DIR": str(tmp_path / "pg"), "TRIBUTARY_LOG__ROOT": str(tmp_path / "log")}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "from tributary.api.cli.main import main; main()", "demo", "--duration", "60"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        summary = re.search(
            r"shop transactions=([\d,]+); records in log=([\d,]+) .*accounts opened=(\d+), commands accepted=([\d,]+) "
            r".*projection runs=([\d,]+), rows written=([\d,]+)",
            out,
        )
        assert summary, out
        transactions, records, accounts, commands, runs, rows = (int(g.replace(",", "")) for g in summary.groups())
        assert transactions > 10 and records > transactions, out
        assert accounts == 4 and commands > 5, out
        assert runs >= 1 and rows > 0, out
        for topic in ("customers", "products", "orders", "order_items"):
            assert f"demo.public.{topic}" in out
        assert "events.account" in out
        assert "failed" not in out, out
        assert "stopped the embedded Postgres" in out
    finally:
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from tributary.api.cli.main import main; main()",
                "pg",
                "down",
                "--data-dir",
                str(tmp_path / "pg"),
            ],
            cwd=ROOT,
            capture_output=True,
            timeout=120,
        )
