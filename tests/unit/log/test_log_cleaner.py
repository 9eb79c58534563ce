"""The cleaner on real files: when it compacts (dirty ratio), when a tombstone may go, and readers
(`Log.read`, splits) that planned or started before a compaction and go on after it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tributary.log.local import Log, TopicConfig, canonical_json, read_split
from tributary.log.local.cleaner import Cleaner, CleanerPolicy, read_checkpoint
from tributary.log.local.compaction import keep_record
from tributary.log.local.segment import list_segments

pytestmark = pytest.mark.unit

R = 100  # delete_retention_ms


def rec(i: int, key: int, ts: int, value: bytes | None = b"") -> tuple:
    v = canonical_json({"n": i}) if value == b"" else value
    return (canonical_json({"id": key}), v, ts, None)


def open_writer(root: Path) -> Log:
    return Log.open(root, writer=True, segment_bytes=400, index_interval_bytes=100)


def latest(records) -> dict[bytes, bytes | None]:
    out: dict[bytes, bytes | None] = {}
    for r in records:
        out[r.key] = r.value
    return out


def live(records) -> dict[bytes, bytes]:
    return {k: v for k, v in latest(records).items() if v is not None}


def test_keep_record_rule() -> None:
    m = {b"k": 5}
    assert keep_record(5, 0, b"k", False, m, 10, R)
    assert not keep_record(4, 0, b"k", False, m, 10, R)  # superseded
    assert keep_record(3, 0, b"other", False, m, 10, R)  # no newer record in the dirty section
    assert keep_record(7, 0, None, False, m, 10, R)  # keyless: always
    # a latest tombstone: kept until old enough AND alone for the retention
    assert keep_record(5, 0, b"k", True, m, 1_000, R, covered_since=None)
    assert keep_record(5, 0, b"k", True, m, 1_000, R, covered_since=950)
    assert keep_record(5, 990, b"k", True, m, 1_000, R, covered_since=0)
    assert not keep_record(5, 0, b"k", True, m, 1_000, R, covered_since=900)


def test_dirty_ratio_decides_when_a_partition_is_compacted(tmp_path: Path) -> None:
    with open_writer(tmp_path / "log") as log:
        log.create_topic("c", TopicConfig(partitions=1, policy="compact"))
        log.create_topic("d", TopicConfig(partitions=1))
        cleaner = Cleaner(log, CleanerPolicy(interval_ms=10, min_cleanable_dirty_ratio=0.5, delete_retention_ms=R))
        assert not cleaner.step(0)  # nothing sealed yet: nothing to do
        log.append("c", 0, [rec(i, i % 2, ts=i) for i in range(40)])
        log.commit()
        assert cleaner.step(10) and not cleaner.queue  # first pass: all dirty, compacted at once
        cp = cleaner.partitions["c/0"]
        assert cp.clean_end == log.partition_state("c", 0).segment and cp.last is not None
        assert (
            cp.last["records_after"]
            < cp.last["records_before"]
            == sum(1 for _ in range(log.partition_state("c", 0).segment))
        )
        dirty, total = cleaner.dirty_bytes("c", 0, cp.clean_end)
        assert dirty == 0 and total > 0
        # a little new sealed data: below the ratio, no pass
        log.append("c", 0, [rec(i, i % 2, ts=i) for i in range(40, 44)])
        log.commit()
        dirty, total = cleaner.dirty_bytes("c", 0, cp.clean_end)
        if dirty and dirty / total < 0.5:
            assert not cleaner.step(20)
        log.append("c", 0, [rec(i, i % 2, ts=i) for i in range(44, 120)])
        log.commit()
        assert cleaner.step(40)
        assert live(log.read("c", 0)) == {
            canonical_json({"id": 0}): canonical_json({"n": 118}),
            canonical_json({"id": 1}): canonical_json({"n": 119}),
        }
        doc = read_checkpoint(log.root)
        assert doc["partitions"]["c/0"]["last"]["at_ms"] == 40 and doc["last_compaction_ms"] == 40
        assert log.verify() == []


def test_a_tombstone_outlives_the_older_values_by_the_retention(tmp_path: Path) -> None:
    """A reader that read an old value just before a pass and reaches the tombstone within
    delete_retention_ms after it must still see the tombstone (Kafka's delete horizon)."""
    root = tmp_path / "log"
    with open_writer(root) as log:
        log.create_topic("c", TopicConfig(partitions=1, policy="compact"))
        log.append("c", 0, [rec(i, 1, ts=i) for i in range(10)])  # key 1, values 0..9
        log.append("c", 0, [rec(10, 1, ts=10, value=None)])  # key 1 deleted
        log.append("c", 0, [rec(i, 2 + i % 3, ts=i) for i in range(11, 60)])  # keeps rolling
        log.commit()
        reader = Log.open(root)
        it = reader.read("c", 0)
        first = next(it)
        assert first.key == canonical_json({"id": 1}) and first.value is not None  # an old value
        cleaner = Cleaner(log, CleanerPolicy(interval_ms=1, delete_retention_ms=R))
        now = 10_000  # the tombstone is long past delete_retention_ms by its own timestamp
        cleaner.clean("c", 0, now)
        after = list(log.read("c", 0))
        key1 = [r for r in after if r.key == canonical_json({"id": 1})]
        assert [r.value for r in key1] == [None]  # older values gone, tombstone kept
        assert cleaner.partitions["c/0"].tombstones_due_ms == now + R
        seen = latest([first, *it])  # the reader goes on after the pass
        assert seen[canonical_json({"id": 1})] is None  # … and sees the deletion
        cleaner.clean("c", 0, now + R - 1)
        assert canonical_json({"id": 1}) in {r.key for r in log.read("c", 0)}
        assert cleaner.step(now + R)  # a scan finds the tombstone due and drops it
        assert canonical_json({"id": 1}) not in {r.key for r in log.read("c", 0)}
        assert log.verify() == []


def _workload(log: Log, rng: random.Random, n: int, start: int, keys: int = 7) -> None:
    for i in range(start, start + n):
        k = rng.randrange(keys)
        value = None if rng.random() < 0.1 else b""
        log.append("c", 0, [rec(i, k, ts=i, value=value)])
        if rng.random() < 0.3:
            log.commit()
    log.commit()


@pytest.mark.parametrize("seed", range(12))
def test_readers_across_compactions_see_valid_records_once_and_the_latest(tmp_path: Path, seed: int) -> None:
    """Interleave a `Log.read` iterator and split reads (planned before) with compaction passes:
    every record is intact, offsets increase and appear at most once, and at the end the reader's
    view per key equals the log's latest (tombstones kept: retention longer than the test)."""
    rng = random.Random(seed)
    root = tmp_path / "log"
    with open_writer(root) as log:
        log.create_topic("c", TopicConfig(partitions=1, policy="compact"))
        cleaner = Cleaner(log, CleanerPolicy(interval_ms=1, delete_retention_ms=10**9))
        _workload(log, rng, 80, 0)
        reader = Log.open(root)
        it = reader.read("c", 0)
        splits = reader.splits("c", max_bytes=rng.choice([150, 300, 700]))
        got = []
        split_records = []
        pending = list(splits)
        rng.shuffle(pending)
        now = 1_000
        while True:
            action = rng.random()
            if action < 0.25:
                now += 1
                cleaner.clean_and_save("c", 0, now)
                counted = Cleaner(log, CleanerPolicy()).partitions["c/0"]  # as read back from cleaner.json
                start, end = log.start_offsets("c")[0], log.end_offsets("c")[0]
                assert counted.records(start, end) == sum(1 for _ in log.read("c", 0)) <= end - start
            elif action < 0.45 and pending:
                split_records.extend(read_split(pending.pop()))
            elif action < 0.55:
                _workload(log, rng, rng.randrange(1, 15), log.end_offsets("c")[0])
            else:
                r = next(it, None)
                if r is None:
                    break
                got.append(r)
        for s in pending:
            split_records.extend(read_split(s))
        snapshot_end = splits[-1].end_offset
        for records in (got, split_records):
            offs = [r.offset for r in records]
            assert len(offs) == len(set(offs)) and all(o < snapshot_end for o in offs)
        assert [r.offset for r in got] == sorted(r.offset for r in got)
        # Read on from where the snapshot ended (as `cat --follow` does): the reader's view per
        # key equals the log's latest — a value it missed was compacted away only because a
        # newer record of its key exists, which it reads now.
        reader.refresh()
        rest = list(reader.read("c", 0, snapshot_end))
        final = list(log.read("c", 0))
        assert latest(got + rest) == latest(final)
        assert latest(sorted(split_records, key=lambda r: r.offset) + rest) == latest(final)
        assert log.verify() == []
        assert list_segments(root / "c" / "0")
        # after more appends, the count is still exact: the last pass's kept records + the span above it
        cp, start, end = cleaner.partitions["c/0"], log.start_offsets("c")[0], log.end_offsets("c")[0]
        assert cp.records(start, end) == len(final) < end - start


def test_a_byte_range_only_split_refuses_a_rewritten_file(tmp_path: Path) -> None:
    """A split without end_offset (built by an older caller) cannot be served by offset: once
    compaction rewrote its file it asks to re-plan instead of reading the wrong bytes."""
    from dataclasses import replace

    from tributary.log.local import LogError

    with open_writer(tmp_path / "log") as log:
        log.create_topic("c", TopicConfig(partitions=1, policy="compact"))
        log.append("c", 0, [rec(i, i % 2, ts=i) for i in range(40)])
        log.commit()
        planned = log.splits("c", max_bytes=150)
        legacy = [replace(s, end_offset=None) for s in planned]
        log.compact(now_ms=0)
        raised = 0
        for s in legacy:
            try:
                list(read_split(s))
            except LogError as exc:
                assert "plan the splits again" in str(exc)
                raised += 1
        assert raised > 0
        # the same splits with their offsets: whole records, each offset once, latest per key
        got = [r for s in planned for r in read_split(s)]
        assert [r.offset for r in got] == sorted({r.offset for r in got})
        assert latest(got) == latest(log.read("c", 0))


def test_stale_parquet_copies_outlive_a_compaction_by_the_delete_delay(tmp_path: Path) -> None:
    """A compaction rewrites segments whose Parquet copies readers may have planned with: the stale
    copies stay for `file_delete_delay_ms`, then a scan deletes them; current copies stay."""
    delay = 1_000
    with open_writer(tmp_path / "log") as log:
        log.create_topic("c", TopicConfig(partitions=1, policy="compact"))
        log.append("c", 0, [rec(i, i % 2, ts=i) for i in range(40)])
        log.commit()
        assert log.write_parquet("c") > 0
        pdir = tmp_path / "log" / "c" / "0"
        before = set(pdir.glob("*.parquet"))
        cleaner = Cleaner(log, CleanerPolicy(interval_ms=10, min_cleanable_dirty_ratio=0.5, file_delete_delay_ms=delay))
        assert cleaner.step(10)  # compacts: every copy now describes an older version of its segment
        assert set(pdir.glob("*.parquet")) == before, "stale copies are kept for readers at first"
        cleaner.step(20)  # a scan before the delay deletes nothing
        assert set(pdir.glob("*.parquet")) == before
        cleaner.step(10 + delay + 20)  # the next scan after the delay
        left = set(pdir.glob("*.parquet"))
        assert left < before, "stale copies are deleted once the delay has passed"
        assert log.write_parquet("c") > 0  # the rewritten segments get new copies …
        current = set(pdir.glob("*.parquet"))
        cleaner.step(10 + 3 * delay)
        assert set(pdir.glob("*.parquet")) == current  # … which later scans leave alone
