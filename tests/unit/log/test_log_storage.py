"""The storage engine on real files in tmp_path: append, commit, read, roll, indexes, splits,
retention, compaction, locking."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tributary.log.local import (
    Log,
    LogError,
    LogLockedError,
    TopicConfig,
    TopicNotFoundError,
    canonical_json,
    read_split,
)
from tributary.log.local.segment import list_segments, load_offset_index

pytestmark = pytest.mark.unit


def rec(i: int, key: int | None = None, ts: int | None = None, value: bytes | None = b"") -> tuple:
    k = None if key is None else canonical_json({"id": key})
    v = canonical_json({"n": i}) if value == b"" else value
    return (k, v, 1_000 + i if ts is None else ts, None)


@pytest.fixture
def log(tmp_path: Path):
    with Log.open(
        tmp_path / "log",
        writer=True,
        default_partitions=2,
        segment_bytes=1000,
        index_interval_bytes=200,
    ) as lg:
        yield lg


def offsets(it) -> list[int]:
    return [r.offset for r in it]


def test_append_is_invisible_until_commit_then_durable(log: Log, tmp_path: Path) -> None:
    log.create_topic("t")
    assert log.append("t", 0, [rec(i) for i in range(5)]) == 0
    reader = Log.open(tmp_path / "log")
    assert offsets(log.read("t", 0)) == [] and log.end_offsets("t") == [0, 0]
    log.commit(positions={"shop": "0/10"})
    assert offsets(log.read("t", 0)) == [0, 1, 2, 3, 4]
    assert offsets(reader.read("t", 0)) == []  # the reader's manifest snapshot is older
    reader.refresh()
    assert reader.end_offsets("t") == [5, 0] and reader.positions() == {"shop": "0/10"}
    got = list(reader.read("t", 0, 2, to_offset=4))
    assert [(r.offset, r.value) for r in got] == [(2, b'{"n":2}'), (3, b'{"n":3}')]
    log.commit(positions={"other": "x"})
    assert log.positions() == {"shop": "0/10", "other": "x"}


def test_mark_commits_a_prefix(log: Log) -> None:
    log.create_topic("t")
    log.append("t", 0, [rec(i) for i in range(3)])
    log.append("t", 1, [rec(i) for i in range(2)])
    mark = log.mark()
    log.append("t", 0, [rec(i) for i in range(3, 30)])  # rolls segments after the mark
    log.commit(upto=mark)
    assert log.end_offsets("t") == [3, 2]
    assert offsets(log.read("t", 0)) == [0, 1, 2]
    log.commit()
    assert offsets(log.read("t", 0)) == list(range(30))


def test_reopen_cuts_uncommitted_and_continues(tmp_path: Path) -> None:
    root = tmp_path / "log"
    with Log.open(root, writer=True, segment_bytes=500) as log:
        log.create_topic("t", TopicConfig(partitions=1))
        log.append("t", 0, [rec(i) for i in range(10)])
        log.commit()
        log.append("t", 0, [rec(i) for i in range(10, 40)])  # rolls, never committed
        log.mark()
    with Log.open(root, writer=True, segment_bytes=500) as log:
        assert log.end_offsets("t") == [10]
        assert log.append("t", 0, [rec(99)]) == 10
        log.commit()
        assert [(r.offset, r.value) for r in log.read("t", 0, 9)] == [
            (9, b'{"n":9}'),
            (10, b'{"n":99}'),
        ]


def test_rolls_by_size_and_by_record_age(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log", writer=True, segment_bytes=600, segment_ms=1000) as log:
        log.create_topic("size", TopicConfig(partitions=1))
        log.create_topic("age", TopicConfig(partitions=1))
        for i in range(20):
            log.append("size", 0, [rec(i)])
        log.append("age", 0, [rec(0, ts=0), rec(1, ts=999), rec(2, ts=1000), rec(3, ts=1500)])
        log.commit()
        segs = list_segments(log.root / "size" / "0")
        assert len(segs) >= 4 and all(os.path.getsize(log.root / "size" / "0" / f"{b:020d}.log") <= 600 for b in segs)
        assert list_segments(log.root / "age" / "0") == [0, 2]
        assert offsets(log.read("size", 0)) == list(range(20))


def test_sparse_index_is_used_and_correct(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log", writer=True, index_interval_bytes=100) as log:
        log.create_topic("t", TopicConfig(partitions=1))
        log.append("t", 0, [rec(i) for i in range(50)])
        log.append("t", 0, [rec(i) for i in range(50, 60)])
        log.commit()
        entries = load_offset_index(log.root / "t" / "0", 0)
        assert len(entries) > 10
        data = (log.root / "t" / "0" / f"{0:020d}.log").read_bytes()
        for rel, pos in entries:  # each entry points at the start of its record's line
            assert data[pos - 1 : pos] == b"\n" and data[pos:].startswith(b'{"offset":%d,' % rel)
        for start in (0, 1, 17, 33, 59):
            assert offsets(log.read("t", 0, start)) == list(range(start, 60))


def test_read_from_time(log: Log) -> None:
    log.create_topic("t", TopicConfig(partitions=1))
    log.append("t", 0, [rec(i, ts=10 * i) for i in range(60)])
    log.commit()
    assert offsets(log.read_from_time("t", 0, 0)) == list(range(60))
    assert offsets(log.read_from_time("t", 0, 205)) == list(range(21, 60))
    assert offsets(log.read_from_time("t", 0, 10_000)) == []


def test_splits_cover_committed_data_exactly_once(log: Log) -> None:
    log.create_topic("t")
    log.append("t", 0, [rec(i) for i in range(40)])
    log.append("t", 1, [rec(i) for i in range(7)])
    log.commit()
    log.append("t", 0, [rec(i) for i in range(40, 45)])  # uncommitted: not in any split
    splits = log.splits("t", max_bytes=300)
    assert len(splits) > 4
    got = sorted((r.partition, r.offset) for s in splits for r in read_split(s))
    assert got == [(0, i) for i in range(40)] + [(1, i) for i in range(7)]


def test_retention_by_bytes_and_time(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log", writer=True, segment_bytes=400) as log:
        log.create_topic("t", TopicConfig(partitions=1, retention_bytes=1000))
        log.create_topic("old", TopicConfig(partitions=1, retention_ms=100))
        log.create_topic("keep", TopicConfig(partitions=1, policy="none", retention_ms=1))
        for name in ("t", "old", "keep"):
            log.append(name, 0, [rec(i, ts=i) for i in range(40)])
        log.commit()
        removed = log.enforce_retention(now_ms=120)
        assert removed > 0
        start = log.start_offsets("t")[0]
        assert start > 0 and offsets(log.read("t", 0)) == list(range(start, 40))
        sizes = sum(p.stat().st_size for p in (log.root / "t" / "0").glob("*.log"))
        assert sizes >= 1000 - 400
        # "old": segments whose newest record is older than now-100 = 20 are gone
        old = offsets(log.read("old", 0))
        assert old[0] > 0 and old[-1] == 39 and offsets(log.read("old", 0, 0))[0] == log.start_offsets("old")[0]
        assert offsets(log.read("keep", 0)) == list(range(40))
    with Log.open(tmp_path / "log") as reader:
        assert reader.start_offsets("t") == [start]


def test_compaction_keeps_latest_per_key_and_offsets(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log", writer=True, segment_bytes=300) as log:
        log.create_topic("c", TopicConfig(partitions=1, policy="compact", delete_retention_ms=100))
        batch = [rec(i, key=i % 3, ts=i) for i in range(30)] + [rec(30, key=1, ts=30, value=None)]
        log.append("c", 0, batch)
        log.append("c", 0, [rec(31, key=9, ts=31)])  # so the tombstone sits in a sealed segment
        log.append("c", 0, [rec(32, key=8, ts=32)])
        log.commit()
        before = offsets(log.read("c", 0))
        stats = log.compact(now_ms=50)
        assert stats.records_after < stats.records_before
        after = list(log.read("c", 0))
        assert offsets(after) == sorted(offsets(after)) and set(offsets(after)) <= set(before)
        latest = {r.key: r.value for r in after}
        assert latest[canonical_json({"id": 0})] == b'{"n":27}'
        assert latest[canonical_json({"id": 2})] == b'{"n":29}'
        assert latest[canonical_json({"id": 1})] is None  # tombstone younger than delete_retention
        assert offsets(log.read("c", 0, 1))[0] > 1  # a compacted-away offset continues at the next
        log.compact(now_ms=1_000)
        keys = [r.key for r in log.read("c", 0)]
        assert canonical_json({"id": 1}) not in keys  # the tombstone is gone once old enough
        assert log.verify() == []


def test_second_writer_is_refused_and_readers_cannot_write(log: Log, tmp_path: Path) -> None:
    with pytest.raises(LogLockedError, match=rf"locked by pid {os.getpid()} \(another tributary capture\?\)"):
        Log.open(tmp_path / "log", writer=True)
    log.create_topic("t")
    reader = Log.open(tmp_path / "log")
    with pytest.raises(LogError, match="read-only"):
        reader.append("t", 0, [rec(0)])
    with pytest.raises(LogError, match="read-only"):
        reader.compact(now_ms=0)


def test_unknown_topic_and_partition(log: Log, tmp_path: Path) -> None:
    with pytest.raises(TopicNotFoundError):
        list(log.read("nope", 0))
    log.create_topic("t")
    with pytest.raises(LogError, match="partitions 0..1"):
        log.append("t", 5, [rec(0)])
    with pytest.raises(LogError, match="invalid topic name"):
        log.create_topic("../etc")
    with pytest.raises(LogError, match="no log at"):
        Log.open(tmp_path / "missing")


def test_create_topic_is_idempotent_and_durable(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log", writer=True) as log:
        cfg = log.create_topic("t", TopicConfig(partitions=3, policy="compact"))
        assert log.create_topic("t") == cfg
    with Log.open(tmp_path / "log") as reader:
        assert reader.topics() == {"t": cfg} and reader.end_offsets("t") == [0, 0, 0]


def test_commit_async_pipelines_commits_in_order(log: Log, tmp_path: Path) -> None:
    log.create_topic("t")
    log.append("t", 0, [rec(i) for i in range(5)])
    first = log.commit_async(positions={"src": "1"})
    log.append("t", 0, [rec(i) for i in range(5, 9)])  # while the first commit may still fsync
    second = log.commit_async(positions={"src": "2"})
    second.result()
    assert first.done() and log.end_offsets("t") == [9, 0] and log.positions() == {"src": "2"}
    gen = (log.root / "manifest.json").read_bytes()
    log.commit()  # nothing new: no manifest write
    assert (log.root / "manifest.json").read_bytes() == gen
    with Log.open(tmp_path / "log") as reader:
        assert offsets(reader.read("t", 0)) == list(range(9))


def test_stale_reader_continues_after_compaction_of_its_active_segment(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log", writer=True, segment_bytes=400) as log:
        log.create_topic("c", TopicConfig(partitions=1, policy="compact"))
        log.append("c", 0, [rec(0, key=2)] + [rec(i, key=1) for i in range(1, 3)])
        log.commit()
        reader = Log.open(tmp_path / "log")  # its snapshot: segment 0 is the active one
        log.append("c", 0, [rec(i, key=1) for i in range(3, 20)])  # rolls past segment 0
        log.commit()
        stats = log.compact(now_ms=0)  # segment 0 shrinks to record 0 (key 2's only record)
        assert stats.segments_rewritten >= 1
        assert offsets(reader.read("c", 0)) == [0]  # not "corrupt": it re-reads the manifest
        reader.refresh()
        assert offsets(reader.read("c", 0))[-1] == 19


def test_parquet_copies_of_sealed_segments(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from tributary.log.local.columnar import is_current

    with Log.open(tmp_path / "log", writer=True, segment_bytes=400) as log:
        log.create_topic("c", TopicConfig(partitions=1, policy="compact"))
        log.append("c", 0, [rec(i, key=i % 2) for i in range(12)] + [rec(12, key=0, value=None)])
        log.commit()
        pdir = log.root / "c" / "0"
        sealed = [b for b in list_segments(pdir) if b < log.ends()[("c", 0)].segment]
        assert log.write_parquet() == len(sealed) > 1
        assert log.write_parquet() == 0  # all current
        rows = [r for b in sealed for r in pq.read_table(pdir / f"{b:020d}.parquet").to_pylist()]
        expected = [r for r in log.read("c", 0) if r.offset < log.ends()[("c", 0)].segment]
        assert [(r["offset"], r["timestamp"], r["key"], r["value"]) for r in rows] == [
            (r.offset, r.timestamp, r.key.decode(), r.value and r.value.decode()) for r in expected
        ]
        stats = log.compact(now_ms=0)  # rewrites segments: their copies go stale, not away
        assert stats.segments_rewritten + stats.segments_deleted > 0
        rewritten = [
            b for b in list_segments(pdir) if (pdir / f"{b:020d}.parquet").exists() and not is_current(pdir, b)
        ]
        assert len(rewritten) == stats.segments_rewritten  # a reader that planned with them may still read them
        for b in rewritten:  # … and what a stale copy holds is the old version's intact records
            old = {r["offset"] for r in pq.read_table(pdir / f"{b:020d}.parquet").to_pylist()}
            assert old > {r.offset for r in log.read("c", 0) if b <= r.offset < b + 100} & old
        assert log.write_parquet() == stats.segments_rewritten
        again = [
            r
            for b in list_segments(pdir)
            if (pdir / f"{b:020d}.parquet").exists()
            for r in pq.read_table(pdir / f"{b:020d}.parquet").to_pylist()
        ]
        assert [r["offset"] for r in again] == [
            r.offset for r in log.read("c", 0) if r.offset < log.ends()[("c", 0)].segment
        ]
