"""The tests' progress-based wait: keeps going while progress moves, fails on a stall or the ceiling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.waiting import Stalled, run_process, size_of, tree_cpu_s, wait_exit, wait_progress

pytestmark = pytest.mark.unit


class FakeClock:
    """Time that moves only when the wait sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _wait(clock: FakeClock, done: Callable[[], bool], progress: Callable[[], object], **kw: float) -> None:
    wait_progress(done, progress, what="the thing", clock=clock, sleep=clock.sleep, poll=1.0, **kw)


def test_returns_at_once_when_done() -> None:
    clock = FakeClock()
    _wait(clock, lambda: True, lambda: 0, stall=5)
    assert clock.now == 0


def test_moving_progress_outlasts_the_stall_period() -> None:
    clock = FakeClock()
    # progress moves every 4 s; done after 100 s, far beyond the 5 s stall period
    _wait(clock, lambda: clock.now >= 100, lambda: int(clock.now // 4), stall=5, ceiling=1000)
    assert clock.now == 100


def test_a_stall_fails_naming_what_and_the_last_value() -> None:
    clock = FakeClock()
    with pytest.raises(Stalled, match=r"no progress for 5s waiting for the thing \(progress stuck at 7\)"):
        _wait(clock, lambda: False, lambda: min(int(clock.now), 7), stall=5, ceiling=1000)
    assert clock.now == 12  # the value last changed at 7 s; 5 s later it gave up


def test_the_ceiling_ends_a_wait_whose_progress_never_stops() -> None:
    clock = FakeClock()
    with pytest.raises(Stalled, match=r"ceiling of 50s reached waiting for the thing \(progress still moving, at 50\)"):
        _wait(clock, lambda: False, lambda: int(clock.now), stall=5, ceiling=50)
    assert clock.now == 50


def test_done_wins_over_a_stall_on_the_same_poll() -> None:
    clock = FakeClock()
    _wait(clock, lambda: clock.now >= 5, lambda: 0, stall=5)
    assert clock.now == 5


def test_size_of_counts_files_and_directories(tmp_path: Path) -> None:
    (tmp_path / "d" / "e").mkdir(parents=True)
    (tmp_path / "d" / "a").write_bytes(b"123")
    (tmp_path / "d" / "e" / "b").write_bytes(b"45")
    (tmp_path / "f").write_bytes(b"6")
    assert size_of(tmp_path / "d", tmp_path / "f", tmp_path / "missing") == 6


def test_wait_exit_returns_the_exit_code() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert wait_exit(proc, what="python", stall=60) == 3


def test_tree_cpu_counts_a_busy_child_of_the_process() -> None:
    """A parent that only waits, its child computing: the tree's CPU seconds move (a Spark JVM
    under the CLI), so a wait on the parent sees progress."""
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', 'while True: pass'])"],
        start_new_session=True,
    )
    try:
        start = tree_cpu_s(parent.pid)
        wait_progress(lambda: tree_cpu_s(parent.pid) >= start + 1, lambda: None, what="a CPU second", stall=60)
    finally:
        os.killpg(parent.pid, signal.SIGKILL)  # the parent and its busy child
        parent.wait()
    assert tree_cpu_s(parent.pid) == 0  # gone: nothing counted


def test_run_process_outlasts_its_stall_period_while_its_output_grows() -> None:
    """Three seconds of work, printing as it goes: a 1 s stall period never ends it."""
    script = "import time\nfor i in range(12):\n    print(i, flush=True)\n    time.sleep(0.25)\nraise SystemExit(2)"
    done = run_process([sys.executable, "-c", script], what="a printer", stall=1)
    assert done.returncode == 2 and done.stdout.split() == [str(i) for i in range(12)]


def test_run_process_fails_on_a_silent_idle_process() -> None:
    script = "import time\ntime.sleep(600)"
    with pytest.raises(Stalled, match=r"no progress for 1s waiting for a sleeper"):
        run_process([sys.executable, "-c", script], what="a sleeper", stall=1)
