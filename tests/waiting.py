"""Waiting in tests by progress, not by wall-clock guesses.

A loaded machine makes real work slower, never wrong: a wait keeps going as long as something it
can observe (a counter, an offset, a row count, the size of a log file, a status field) keeps
moving, and fails only when that stops moving for `stall` seconds, or at a hard `ceiling` far above
any normal run (so a test that makes progress forever still ends).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Hashable
from pathlib import Path

STALL_S = 120.0
CEILING_S = 1200.0
POLL_S = 0.1


class Stalled(AssertionError):
    """A wait gave up: what it waited for, what stopped moving, and its last value."""


def wait_progress(
    done: Callable[[], bool],
    progress: Callable[[], Hashable],
    *,
    what: str,
    stall: float = STALL_S,
    ceiling: float = CEILING_S,
    poll: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once `done()`; while `progress()` keeps changing, keep waiting.

    Fails when `progress()` has not changed for `stall` seconds, or `ceiling` seconds passed in all.
    `clock` and `sleep` are passed in so the rule itself is tested without waiting.
    """
    start = clock()
    last = progress()
    moved_at = start
    while True:
        if done():
            return
        now = clock()
        value = progress()
        if value != last:
            last, moved_at = value, now
        if now - moved_at >= stall:
            raise Stalled(f"no progress for {stall:g}s waiting for {what} (progress stuck at {last!r})")
        if now - start >= ceiling:
            raise Stalled(f"ceiling of {ceiling:g}s reached waiting for {what} (progress still moving, at {last!r})")
        sleep(poll)


def size_of(*paths: Path, skip: str | None = None) -> int:
    """Total bytes under files/directories (a log root, an output file): grows while work happens.

    Files whose name starts with `skip` are left out (a status file rewritten even when idle)."""
    total = 0
    for path in paths:
        if path.is_file():
            total += path.stat().st_size
        elif path.is_dir():
            for root, _dirs, files in os.walk(path):
                for name in files:
                    if skip is not None and name.startswith(skip):
                        continue
                    try:
                        total += os.stat(os.path.join(root, name)).st_size
                    except FileNotFoundError:
                        continue  # a segment replaced while we walked
    return total


def tree_cpu_s(pid: int) -> int:
    """Whole CPU seconds used by process `pid` and its descendants (a Spark JVM, a pgbench): moves
    while they compute, even when they print nothing; an idle poll loop does not move it."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        child = int(stat.parent.name)
        parent[child] = int(fields[1])
        ticks[child] = int(fields[11]) + int(fields[12])  # utime, stime
    tree, frontier = {pid}, [pid]
    while frontier:
        found = [c for c, p in parent.items() if p in frontier and c not in tree]
        tree.update(found)
        frontier = found
    return sum(ticks.get(p, 0) for p in tree) // os.sysconf("SC_CLK_TCK")


def wait_exit(
    proc: subprocess.Popen[bytes] | subprocess.Popen[str],
    *,
    what: str,
    progress: Callable[[], Hashable] | None = None,
    stall: float = STALL_S,
    ceiling: float = CEILING_S,
) -> int:
    """Wait for a process to exit while `progress()` (e.g. its output's size) or the CPU time of
    the process and its children keeps moving."""
    moving = progress or (lambda: None)
    wait_progress(
        lambda: proc.poll() is not None,
        lambda: (moving(), tree_cpu_s(proc.pid)),
        what=what,
        stall=stall,
        ceiling=ceiling,
        poll=0.25,
        sleep=lambda seconds: _exited_within(proc, seconds),
    )
    return proc.returncode


def _exited_within(proc: subprocess.Popen[bytes] | subprocess.Popen[str], seconds: float) -> None:
    """Sleep `seconds`, or less when the process exits meanwhile (so no poll period is lost)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=seconds)


def run_process(
    cmd: list[str],
    *,
    what: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    progress: Callable[[], Hashable] | None = None,
    stall: float = STALL_S,
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(cmd, capture_output=True, text=True)` without a guess at its speed: its output
    goes to files (no pipe to fill) and the wait goes on while that output grows, the process and
    its children use CPU, or `progress()` (work done elsewhere: a Spark worker's logs) moves; a
    stalled one is killed and the wait fails."""
    moving = progress or (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        out_path, err_path = Path(tmp) / "out", Path(tmp) / "err"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=cwd, env=env)
        try:
            code = wait_exit(proc, what=what, progress=lambda: (size_of(out_path, err_path), moving()), stall=stall)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return subprocess.CompletedProcess(cmd, code, out_path.read_text(), err_path.read_text())


def wait_threads(threads: list[threading.Thread], *, what: str, progress: Callable[[], Hashable]) -> None:
    """Join `threads` while `progress()` (what they produce) keeps moving."""
    wait_progress(lambda: not any(t.is_alive() for t in threads), progress, what=what)
