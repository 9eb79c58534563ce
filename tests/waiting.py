"""Waiting in tests by progress, not by wall-clock guesses.

A loaded machine makes real work slower, never wrong: a wait keeps going as long as something it
can observe (a counter, an offset, a row count, the size of a log file, a status field) keeps
moving, and fails only when that stops moving for `stall` seconds, or at a hard `ceiling` far above
any normal run (so a test that makes progress forever still ends).
"""

from __future__ import annotations

import os
import subprocess
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


def wait_exit(
    proc: subprocess.Popen[bytes] | subprocess.Popen[str],
    *,
    what: str,
    progress: Callable[[], Hashable] | None = None,
    stall: float = STALL_S,
    ceiling: float = CEILING_S,
) -> int:
    """Wait for a process to exit while `progress()` (e.g. its output's size) keeps moving."""
    wait_progress(
        lambda: proc.poll() is not None,
        progress or (lambda: None),
        what=what,
        stall=stall,
        ceiling=ceiling,
    )
    return proc.returncode
