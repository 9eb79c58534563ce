"""`tributary capture` on a terminal shows what it does (each source, its state, changes and changes/s,
redrawn as they change); with stdout and stderr not terminals it prints nothing but its logs.

The terminal is a real pseudo-terminal (`pty`), the pipe a real pipe; the capture is a real one."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import ROOT, capture_progress, wait_for, write_config
from tests.waiting import wait_exit

pytestmark = pytest.mark.integration

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIBUTARY_") and k not in ("COLUMNS", "LINES")}
    return {**env, "TERM": "xterm-256color", "COLUMNS": "160"}


def _command(config: Path) -> list[str]:
    return [sys.executable, "-c", "from tributary.api.cli.main import main; main()", "capture", "--config", str(config)]


def _config(tmp_path: Path, dsn: str) -> Path:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total numeric(12,2))")
        conn.execute("INSERT INTO orders SELECT g, g FROM generate_series(1, 50) g")
    return write_config(tmp_path / "tributary.toml", dsn=dsn, log_root=tmp_path / "log")


def _insert(dsn: str, first: int, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO orders SELECT g, g FROM generate_series(%s::int, %s::int) g", (first, first + n - 1))


def test_capture_on_a_terminal_shows_sources_state_and_rate(tmp_path: Path, fresh_db: str) -> None:
    config = _config(tmp_path, fresh_db)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        _command(config), cwd=ROOT, env=_env(), stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    seen = bytearray()

    def screen() -> str:
        while select.select([master], [], [], 0)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: the process is gone
                break
            if not chunk:
                break
            seen.extend(chunk)
        return ANSI.sub("\n", seen.decode(errors="replace"))

    try:
        # the snapshot's 50 rows are not changes: streaming starts at 0
        wait_for(
            lambda: re.search(r"shop\s+streaming\s+0 changes", screen()) is not None,
            60,
            "the streaming line",
            progress=lambda: capture_progress(config.parent / "log"),
        )
        assert re.search(r"capture → \S*log", screen()), screen()
        _insert(fresh_db, 1000, 300)  # the line updates: the changes so far, a rate
        wait_for(
            lambda: re.search(r"shop\s+streaming\s+300 changes", screen()) is not None,
            60,
            "300 changes",
            progress=lambda: capture_progress(config.parent / "log"),
        )
        # the rate is measured over a second or so: a redraw shows it above 0
        wait_for(
            lambda: re.search(r"[1-9][\d,]*\.\d changes/s", screen()) is not None,
            10,
            "a rate above 0",
            progress=lambda: capture_progress(config.parent / "log"),
        )
        proc.send_signal(signal.SIGTERM)
        assert wait_exit(proc, what="capture to stop", progress=lambda: capture_progress(config.parent / "log")) == 0, (
            screen()
        )
        assert re.search(r"shop\s+stopped", screen()), screen()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)


def test_capture_off_a_terminal_prints_only_its_logs(tmp_path: Path, fresh_db: str) -> None:
    config = _config(tmp_path, fresh_db)
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(
            _command(config), cwd=ROOT, env=_env(), stdin=subprocess.DEVNULL, stdout=out, stderr=err
        )
    try:
        status = config.parent / "log" / "capture-status.json"
        wait_for(
            lambda: status.exists() and '"streaming"' in status.read_text(),
            60,
            "streaming",
            progress=lambda: capture_progress(config.parent / "log"),
        )
        _insert(fresh_db, 1000, 300)
        wait_for(
            lambda: '"changes": 300' in status.read_text(),
            60,
            "300 changes",
            progress=lambda: capture_progress(config.parent / "log"),
        )
        time.sleep(1.5)  # a live display would have redrawn by now
        proc.send_signal(signal.SIGTERM)
        code = wait_exit(proc, what="capture to stop", progress=lambda: capture_progress(config.parent / "log"))
        assert code == 0, err_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out_path.read_text() == ""
    for line in err_path.read_text().splitlines():
        assert LOG_LINE.match(line), err_path.read_text()
