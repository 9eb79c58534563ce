"""The log's format-2 Parquet copies through its public API: it plans them (`SegmentCopy`), reads
their records (`copy_records`) and installs what the caller's Parquet writer made
(`Log.make_copies`); tail copies of an active segment (`Log.tail_copy`, `sweep_tail_copies`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tributary.log.local import (
    COPY_SCHEMA,
    RECORD_SCHEMA,
    Log,
    SegmentCopy,
    TailCopy,
    TopicConfig,
    canonical_json,
    copy_records,
)

pytestmark = pytest.mark.unit

TOPIC = "t"


@pytest.fixture
def log(tmp_path: Path):
    with Log.open(tmp_path / "log", writer=True, segment_bytes=2000, index_interval_bytes=200) as lg:
        lg.create_topic(TOPIC, TopicConfig(partitions=2))
        for i in range(120):
            key = canonical_json({"id": i})
            lg.append(TOPIC, lg.partition_for(TOPIC, key), [(key, canonical_json({"n": i}), 1_000 + i, None)])
        lg.commit()
        yield lg


def _sealed(log: Log) -> list[SegmentCopy]:
    ends = log.ends()
    paths = {(s.partition, s.path) for s in log.splits(TOPIC, max_bytes=1 << 20)}
    return sorted(
        (
            SegmentCopy(TOPIC, p, path)
            for p, path in paths
            if SegmentCopy(TOPIC, p, path).base != ends[(TOPIC, p)].segment
        ),
        key=lambda c: (c.partition, c.base),
    )


def _rows(log: Log, partition: int, lo: int, hi: int) -> list[tuple]:
    return [
        (r.topic, r.partition, r.offset, r.timestamp, r.key and r.key.decode(), r.value and r.value.decode(), None)
        for r in log.read(TOPIC, partition, lo)
        if r.offset < hi
    ]


def _pyarrow_writer(skip: int | None = None) -> Callable[[Path, Sequence[SegmentCopy]], None]:
    """A Parquet writer as `make_copies` wants one: copy i's records under staging/seg=i/."""

    def write(staging: Path, copies: Sequence[SegmentCopy]) -> None:
        for i, c in enumerate(copies):
            table = copy_records(c)
            if i == skip or table is None:
                continue
            (staging / f"seg={i}").mkdir(parents=True)
            pq.write_table(table, staging / f"seg={i}" / "part-0.parquet")

    return write


def test_the_record_schema_is_the_copy_schema_without_the_size() -> None:
    assert COPY_SCHEMA.names == [*RECORD_SCHEMA.names, "segment_bytes"]
    assert RECORD_SCHEMA.names == ["topic", "partition", "offset", "timestamp", "key", "value", "headers"]


def test_copy_records_are_the_segments_records(log: Log) -> None:
    sealed = _sealed(log)
    assert len(sealed) >= 4
    for c in sealed:
        table = copy_records(c)
        assert table is not None and table.schema == COPY_SCHEMA
        rows = [tuple(r.values())[:7] for r in table.to_pylist()]
        first, last = rows[0][2], rows[-1][2]
        assert rows == _rows(log, c.partition, first, last + 1)
        assert set(table["segment_bytes"].to_pylist()) == {os.path.getsize(c.segment)}


def test_make_copies_installs_what_the_writer_made_and_cleans_up(log: Log) -> None:
    sealed = _sealed(log)
    assert not any(c.current() for c in sealed)
    made = log.make_copies(sealed, _pyarrow_writer(skip=1))
    assert made == [c for i, c in enumerate(sealed) if i != 1]
    assert [c.current() for c in sealed] == [i != 1 for i in range(len(sealed))]
    for c in made:
        assert pq.read_table(c.path).equals(copy_records(c))
    assert not list(log.root.glob(".columnar-*.tmp")), "the staging directory is removed"


def test_a_copy_made_before_a_rewrite_is_not_current(log: Log) -> None:
    c = _sealed(log)[0]
    log.make_copies([c], _pyarrow_writer())
    assert c.current()
    with open(c.segment, "ab") as f:  # the segment is not the bytes the copy was made from any more
        f.write(b"\n")
    assert not c.current()


def test_make_copies_sweeps_staging_directories_left_by_killed_jobs(log: Log) -> None:
    stale, fresh = log.root / ".columnar-old.tmp", log.root / ".columnar-new.tmp"
    for d in (stale, fresh):
        (d / "seg=0").mkdir(parents=True)
    old = time.time() - 2 * 86400
    os.utime(stale, (old, old))
    log.make_copies(_sealed(log)[:1], _pyarrow_writer())
    assert not stale.exists() and fresh.exists()


def test_tail_copy_stands_for_the_committed_prefix_until_superseded(log: Log) -> None:
    end = log.ends()[(TOPIC, 0)]
    active = next(s.path for s in log.splits(TOPIC) if s.partition == 0 and s.base == end.segment)
    assert log.tail_copy(TOPIC, 0, end) is None
    tail = SegmentCopy(TOPIC, 0, active, TailCopy(end.segment, end.end, end.nbytes))
    assert log.make_copies([tail], _pyarrow_writer()) == [tail]
    assert log.tail_copy(TOPIC, 0, end) == tail.tail
    assert pq.read_table(tail.path).num_rows == end.end - end.segment

    key = canonical_json({"id": "more"})
    log.append(TOPIC, 0, [(key, b"1", 5_000, None)])
    log.commit()
    later = log.ends()[(TOPIC, 0)]
    assert later.segment == end.segment, "still the active segment"
    assert log.tail_copy(TOPIC, 0, later) == tail.tail, "a prefix of the new committed end"

    newer = replace(tail, tail=TailCopy(later.segment, later.end, later.nbytes))
    log.make_copies([newer], _pyarrow_writer())
    assert log.tail_copy(TOPIC, 0, later) == newer.tail
    assert log.sweep_tail_copies(TOPIC, 0, now=time.time(), grace_s=600) == []
    assert log.sweep_tail_copies(TOPIC, 0, now=time.time() + 601, grace_s=600) == [tail.path]
    assert newer.path.exists()


def test_disk_bytes_counts_the_topics_files(log: Log) -> None:
    files = [f for f in (log.root / TOPIC).rglob("*") if f.is_file()]
    assert log.disk_bytes(TOPIC) == sum(f.stat().st_size for f in files) > 0


def test_opening_a_log_does_not_load_pyarrow(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from tributary.log.local import Log;"
        "Log.open(Path(sys.argv[1]), writer=True).close(); print('pyarrow' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "log")], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
