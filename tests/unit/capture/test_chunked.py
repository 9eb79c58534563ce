"""Pure parts of chunked snapshots (capture/snapshot/chunked.py): the context's JSON, the visibility rule
against a snapshot's xmax/xip across xid wraparound, the bounded set of recent commits, and the
keys a watch (and a re-snapshot's keeping) collects from every staging path, and the check a
re-snapshot begun in this process makes without querying the table."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.capture.records import envelope as env
from tributary.capture.records.staging import Staging
from tributary.capture.snapshot.chunked import RecentXids, SnapshotContext, _invisible, _Kept, context_key
from tributary.log import Mark
from tributary.log.local import Log

pytestmark = pytest.mark.unit

names = st.text(alphabet="abcdefgh._", min_size=1, max_size=12)


@given(
    pending=st.lists(names, max_size=4),
    last=st.none() | st.lists(st.none() | st.text(max_size=8), min_size=1, max_size=3),
    done=st.none() | st.lists(names, max_size=4),
    rows=st.integers(0, 10**12),
    checked=st.none() | st.text(max_size=10),
)
def test_context_round_trips(
    pending: list[str], last: list[str | None] | None, done: list[str] | None, rows: int, checked: str | None
) -> None:
    ctx = SnapshotContext(pending=pending, last=last, done=done, rows=rows, chunks=rows // 7, checked=checked)
    assert SnapshotContext.from_json(ctx.to_json()) == ctx


def test_context_key_is_never_a_source_name() -> None:
    assert context_key("shop") == "shop#snapshot" and not context_key("shop").isidentifier()


@given(xmax=st.integers(0, 2**64 - 1), delta=st.integers(-(2**31) + 1, 2**31 - 1))
def test_visibility_follows_xmax_across_wraparound(xmax: int, delta: int) -> None:
    """A transaction at or after xmax was not visible; one before it (not in xip) was — with
    32-bit ids that wrap, as wal2json prints them."""
    xid = (xmax + delta) % 2**32
    assert _invisible(xid, xmax % 2**32, frozenset()) == (delta >= 0)


def test_a_transaction_in_progress_was_not_visible() -> None:
    assert _invisible(90, 100, frozenset({90}))
    assert not _invisible(89, 100, frozenset({90}))


def test_recent_xids_tell_commits_before_a_watch_began() -> None:
    recent = RecentXids(bound=3)
    recent.add(10)
    watch = recent.seq + 1
    recent.add(11)
    assert recent.before(frozenset({10}), watch)
    assert not recent.before(frozenset({11, 12}), watch), "committed after the watch began: the watch has it"
    for xid in range(20, 30):
        recent.add(xid)
    assert not recent.before(frozenset({10}), watch + 20), "bounded: the oldest are forgotten"
    assert recent.before(frozenset({29}), recent.seq + 1), "the newest are kept"


def test_a_watch_collects_keys_from_every_staging_path(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log", writer=True, default_partitions=2) as log:
        staging = Staging(log, partitions=2)
        watch = staging.watch("t")
        staging.xid = 7
        staging.stage([env.Output("t", b"a", b"1"), env.Output("u", b"z", b"1")], 0)
        staging.stage_record("t", b"b", b"1", 0)
        staging.xid = 8
        staging.stage_pairs("t", [(b"c", b"1")], 0)
        staging.append_run("t", [b"d", b"e"], [b"1", b"1"], 0)
        assert dict(watch.by_xid) == {7: {b"a", b"b"}, 8: {b"c", b"d", b"e"}}
        assert not watch.invalid
        staging.to_all_partitions("t", None, b"truncate", 0)
        assert watch.invalid, "a truncate (or schema change) makes the chunk be read again"
        staging.unwatch("t")
        staging.stage_record("t", b"f", b"1", 0)
        assert b"f" not in set().union(*watch.by_xid.values())


def test_kept_keys_come_from_every_staging_path_and_from_what_is_staged_already(tmp_path: Path) -> None:
    with Log.open(tmp_path / "log", writer=True, default_partitions=2) as log:
        staging = Staging(log, partitions=2)
        staging.stage_record("t", b"before", b"1", 0)  # staged, not yet appended, when keeping begins
        staging.stage_record("u", b"other", b"1", 0)
        kept = staging.keep("t")
        assert kept == {b"before"}
        staging.stage([env.Output("t", b"a", b"1"), env.Output("u", b"z", b"1")], 0)
        staging.stage([env.Output("t", b"c", None)], 0)  # a tombstone's key too
        staging.append_run("t", [b"d"], [b"1"], 0)
        watch = staging.watch("t")  # a chunk's watch beside it: both collect
        staging.stage_record("t", b"e", b"1", 0)
        staging.unwatch("t")
        staging.stage_record("t", b"f", b"1", 0)  # between chunks: still kept
        assert kept == {b"before", b"a", b"c", b"d", b"e", b"f"}
        assert set().union(*watch.by_xid.values()) == {b"e"}
        staging.unkeep("t")
        staging.stage_record("t", b"g", b"1", 0)
        assert b"g" not in kept


def test_the_kept_check_deletes_the_live_keys_nothing_staged_names() -> None:
    kept = _Kept("public.t", "s.public.t", Mark(), {b"streamed"})
    kept.read.append(pa.array([b"read1", b"read2"], pa.binary()))
    kept.frozen = pa.array(sorted(kept.streamed), pa.binary())
    live = {b"read2", b"gone2", b"streamed", b"gone1", b"read1"}
    assert kept.absent(live) == [b"gone1", b"gone2"]
    assert _Kept("public.t", "s.public.t", Mark(), set()).absent({b"read2", b"gone2"}) == [b"gone2", b"read2"]
