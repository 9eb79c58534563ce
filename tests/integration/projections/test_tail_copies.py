"""Tail copies: Parquet copies of an active segment's committed prefix (`columnar.TailCopy`).

A run that reads all of an active segment's uncopied committed bytes (≥ TAIL_COPY_BYTES) has a
copy made; later runs read the copy and only what was committed after it as row splits. The
records must be exactly the committed ones whatever happened in between: more appends
(committed or not), a copy left half-made, the segment sealed and compacted.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from tributary.log.local import Log, TopicConfig, canonical_json
from tributary.log.local.columnar import (
    STALE_COPY_DIR_S,
    TailCopy,
    sweep_stale_copy_dirs,
    sweep_tail_copies,
    tail_copies,
    tail_copy_valid,
)
from tributary.projections import source
from tributary.projections.source import records_frame

pytestmark = pytest.mark.integration

TOPIC = "events.thing"
PROJECTION_FILE = f"""
from tributary.projections.definition import Projection, Table
PROJECTION = Projection(
    name="tails", version=1, topics=({TOPIC!r},), table=Table.of({{"k": "text"}}, ["k"]), build=lambda df: df,
)
"""


@pytest.fixture
def small_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any uncopied committed bytes are enough for a tail copy."""
    monkeypatch.setattr(source, "TAIL_COPY_BYTES", 1)


def _open(root: Path, *, policy: str = "delete", segment_bytes: int = 1 << 30) -> Log:
    log = Log.open(root, writer=True)
    log.create_topic(TOPIC, TopicConfig(partitions=2, policy=policy, segment_bytes=segment_bytes))  # type: ignore[arg-type]
    return log


def _append(log: Log, start: int, n: int, keys: int = 1000, commit: bool = True) -> None:
    for i in range(start, start + n):
        key = canonical_json(f"k{i % keys}")
        value = orjson.dumps({"type": "Seen", "i": i, "occurred_at": "2026-11-23T09:00:00Z"})
        log.append(TOPIC, log.partition_for(TOPIC, key), [(key, value, 1_700_000_000_000 + i, None)])
    if commit:
        log.commit()


def _frame(spark: Any, log: Log, tmp_path: Path) -> Any:
    module = tmp_path / "tails.py"
    module.write_text(PROJECTION_FILE)
    hi = {tp: e.end for tp, e in log.ends().items()}
    return records_frame(spark, log, modules=[str(module)], mirror=[], name="tails", topics=[TOPIC], lo={}, hi=hi)


def _records(frame: Any) -> list[tuple[Any, ...]]:
    return sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in frame.collect())


def _committed(log: Log) -> list[tuple[Any, ...]]:
    """The oracle: the committed records, read row by row."""
    out = []
    for p in range(2):
        for rec in log.read(TOPIC, p, 0):
            out.append((p, rec.offset, rec.key and rec.key.decode(), rec.value and rec.value.decode()))
    return sorted(out)


def _copies(log: Log) -> dict[int, list[TailCopy]]:
    return {p: tail_copies(log.root / TOPIC / str(p)) for p in range(2)}


def test_a_copy_holds_only_committed_records_and_later_appends_are_read_as_rows(
    spark: Any, tmp_path: Path, small_copies: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _open(tmp_path / "log")
    _append(log, 0, 3000)
    _append(log, 3000, 500, commit=False)  # appended, not committed: in the file, never in a copy
    assert _records(_frame(spark, log, tmp_path)) == _committed(log)
    copies = _copies(log)
    for p, end in ((p, e.end) for (_, p), e in log.ends().items()):
        assert [c.end for c in copies[p]] == [end], "one copy per partition, ending at the commit"
    assert sum(len(c) for c in copies.values()) == 2

    # Committed after the copy: the next run (no new copy) reads the copy, then rows from its end.
    log.commit()
    _append(log, 3500, 700)
    _append(log, 4200, 300, commit=False)
    monkeypatch.setattr(source, "TAIL_COPY_BYTES", 1 << 40)
    rows, segments = source.plan(log, [TOPIC], {}, {tp: e.end for tp, e in log.ends().items()}, 1 << 20)
    assert {s.tail for s in segments} == {c[0] for c in copies.values()}
    assert rows
    for r in rows:  # each partition's rows start at its copy's end, at the copy's byte position
        copy = copies[r[1]][0]
        assert (r[3], r[5], r[6]) == (copy.nbytes, copy.end, copy.end)
    assert _records(_frame(spark, log, tmp_path)) == _committed(log)

    # A new copy supersedes the old one; the old one goes once the grace period has passed.
    monkeypatch.setattr(source, "TAIL_COPY_BYTES", 1)
    assert _records(_frame(spark, log, tmp_path)) == _committed(log)
    for p, copies_ in _copies(log).items():
        assert [c.end for c in copies_] == [log.ends()[(TOPIC, p)].end, copies[p][0].end]
        pdir = log.root / TOPIC / str(p)
        assert sweep_tail_copies(pdir, 0, time.time(), 600) == []
        assert sweep_tail_copies(pdir, 0, time.time() + 601, 600) == [copies[p][0].path(pdir)]
    assert _records(_frame(spark, log, tmp_path)) == _committed(log)


def test_half_made_or_foreign_copies_are_not_used(
    spark: Any, tmp_path: Path, small_copies: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash mid-copy leaves a temporary directory (never read) or, at worst, a file under a
    copy's name that is not a whole copy of those bytes: it is refused and the rows are read."""
    log = _open(tmp_path / "log")
    _append(log, 0, 2000)
    want = _committed(log)
    assert _records(_frame(spark, log, tmp_path)) == want
    pdir = log.root / TOPIC / "0"
    good = tail_copies(pdir)[0]
    end = log.ends()[(TOPIC, 0)]
    assert tail_copy_valid(pdir, good, end.end, end.nbytes)

    data = good.path(pdir).read_bytes()
    good.path(pdir).write_bytes(data[: len(data) // 2])  # torn
    assert not tail_copy_valid(pdir, good, end.end, end.nbytes)
    (log.root / ".columnar-crashed.tmp" / "seg=0").mkdir(parents=True)  # a crashed job's leftovers
    # claims more rows than it holds (a copy of other bytes): refused by its footer
    liar = TailCopy(good.base, good.end - 1, good.nbytes)
    liar.path(pdir).write_bytes(data)
    assert not tail_copy_valid(pdir, liar, end.end, end.nbytes)
    # the same bytes claimed up to an offset that does not start at nbytes: refused by the segment
    _append(log, 2000, 50)
    end = log.ends()[(TOPIC, 0)]
    shifted = TailCopy(good.base, good.end + 1, good.nbytes)
    os.replace(liar.path(pdir), shifted.path(pdir))
    assert not tail_copy_valid(pdir, shifted, end.end, end.nbytes)
    good.path(pdir).write_bytes(data)
    assert tail_copy_valid(pdir, good, end.end, end.nbytes)
    assert not tail_copy_valid(pdir, good, good.end - 1, good.nbytes - 1), "beyond the commit"

    good.path(pdir).write_bytes(data[: len(data) // 2])
    shifted.path(pdir).unlink()
    monkeypatch.setattr(source, "TAIL_COPY_BYTES", 1 << 40)  # no new copy: the torn one must be refused
    assert _records(_frame(spark, log, tmp_path)) == _committed(log)


def test_a_sealed_and_compacted_segment_is_not_read_from_its_tail_copy(
    spark: Any, tmp_path: Path, small_copies: None
) -> None:
    log = _open(tmp_path / "log", policy="compact", segment_bytes=64 << 10)
    _append(log, 0, 150, keys=20)  # less than a segment: the tail copy holds every offset
    assert _records(_frame(spark, log, tmp_path)) == _committed(log)
    before = _copies(log)
    assert all(c and c[0].base == 0 for c in before.values())

    _append(log, 150, 1500, keys=20)  # seals segment 0 of each partition
    assert all(e.segment > 0 for e in log.ends().values())
    log.compact(TOPIC, now_ms=1_800_000_000_000)
    want = _committed(log)
    assert len(want) < 1650, "compaction removed superseded records"
    assert _records(_frame(spark, log, tmp_path)) == want
    for p, copies in _copies(log).items():
        pdir = log.root / TOPIC / str(p)
        active = log.ends()[(TOPIC, p)].segment
        assert before[p][0] in copies, "kept during the grace period"
        sweep_tail_copies(pdir, active, time.time() + 601, 600)
        assert all(c.base == active for c in tail_copies(pdir)), "the sealed segment's copy is gone"
    assert _records(_frame(spark, log, tmp_path)) == want


def test_a_run_starting_inside_the_segment_makes_no_copy(spark: Any, tmp_path: Path, small_copies: None) -> None:
    """An incremental run (from a checkpoint inside the active segment) reads its new records as
    rows, after the copy's end, and does not copy the whole segment for their sake."""
    log = _open(tmp_path / "log")
    _append(log, 0, 1000)
    assert _records(_frame(spark, log, tmp_path)) == _committed(log)
    first = _copies(log)
    _append(log, 1000, 400)
    module = tmp_path / "tails.py"
    lo = {(TOPIC, p): c[0].end - 5 for p, c in first.items()}  # from a little before the copy's end
    hi = {tp: e.end for tp, e in log.ends().items()}
    frame = records_frame(spark, log, modules=[str(module)], mirror=[], name="tails", topics=[TOPIC], lo=lo, hi=hi)
    want = [r for r in _committed(log) if r[1] >= lo[(TOPIC, r[0])]]
    assert _records(frame) == want
    assert _copies(log) == first


def test_a_killed_copy_jobs_temporary_directory_is_swept_once_stale(tmp_path: Path) -> None:
    now = time.time()
    stale, fresh, other = (tmp_path / ".columnar-a.tmp"), (tmp_path / ".columnar-b.tmp"), (tmp_path / "keep.tmp")
    for d in (stale, fresh, other):
        (d / "seg=0").mkdir(parents=True)
        (d / "seg=0" / "part-0.parquet").write_bytes(b"x")
    os.utime(stale, (now - STALE_COPY_DIR_S - 60, now - STALE_COPY_DIR_S - 60))
    os.utime(other, (now - STALE_COPY_DIR_S - 60, now - STALE_COPY_DIR_S - 60))
    assert sweep_stale_copy_dirs(tmp_path, now) == [stale]
    assert not stale.exists() and fresh.exists() and other.exists()
