"""kill -9 a writer at random moments; the reopened log holds exactly a committed prefix."""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import pytest

from tributary.log.local import Log

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
RUNS = 24
sys.path.insert(0, str(HERE))
from crash_writer import PARTS, kill, spawn, value  # noqa: E402


def _run_and_kill(root: Path, seed: int, delay: float) -> tuple[list[int], list[int], int]:
    proc = spawn(root, seed)
    time.sleep(delay)  # a random moment of its run
    return kill(proc)


def test_kill_minus_9_at_random_points(tmp_path: Path) -> None:
    root = tmp_path / "log"
    rnd = random.Random(20261122)
    floor = [0] * PARTS  # what earlier runs proved committed
    for run in range(RUNS):
        committed, intent, n = _run_and_kill(root, seed=run, delay=rnd.uniform(0.3, 0.7))
        committed = [max(a, b) for a, b in zip(committed, floor, strict=True)]
        with Log.open(root, writer=True) as log:  # recovery
            ends = log.end_offsets("t")
            for p in range(PARTS):
                assert committed[p] <= ends[p], f"run {run}: committed data lost in partition {p}"
                assert ends[p] <= max(intent[p], committed[p]), f"run {run}: uncommitted data visible"
                # this run's records byte for byte (earlier runs' were checked then; verify() below
                # re-checks every CRC)
                since = max(floor[p] - 5, 0)
                got = [(r.offset, r.value) for r in log.read("t", p, since)]
                assert got == [(o, value(p, o)) for o in range(since, ends[p])], f"run {run}: p{p} damaged"
                seg = log.ends()[("t", p)]
                data = root / "t" / str(p) / f"{seg.segment:020d}.log"
                assert data.stat().st_size == seg.nbytes, "recovery left uncommitted bytes behind"
            if n:
                assert int(log.positions()["src"]) >= n
            if run % 6 == 5:
                assert log.verify() == []
            # appends continue at the next offset
            assert log.append("t", 0, [(None, value(0, ends[0]), ends[0], None)]) == ends[0]
            log.commit()
            floor = [ends[0] + 1] + ends[1:]
    assert sum(floor) > 0
