"""`tributary demo` as a user runs it: everything on the embedded default, then a summary."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_end_to_end_and_reports_work(tmp_path: Path) -> None:
    env = {**os.environ, "TRIBUTARY_PG_DATA_DIR": str(tmp_path / "pg"), "TRIBUTARY_LOG__ROOT": str(tmp_path / "log")}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "from api.cli import main; main()", "demo", "--duration", "8"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        summary = re.search(r"workload transactions=([\d,]+) .*records in log=([\d,]+)", out)
        assert summary, out
        transactions, records = (int(g.replace(",", "")) for g in summary.groups())
        assert transactions > 10 and records > transactions
        for table in ("customers", "products", "orders", "order_items"):
            assert f"demo.public.{table}" in out
        assert '"op":"' in out  # a real change record was shown
        assert "stopped the embedded Postgres" in out
    finally:
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from api.cli import main; main()",
                "pg",
                "down",
                "--data-dir",
                str(tmp_path / "pg"),
            ],
            cwd=ROOT,
            capture_output=True,
            timeout=120,
        )
