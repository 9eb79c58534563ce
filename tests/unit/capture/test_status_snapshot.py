"""How the snapshot under way reads in `capture status`, `GET /sources` and metrics. Pure."""

from __future__ import annotations

import pytest

from tributary.capture.status import SourceState, SourceStatus, snapshot_summary, snapshot_view

pytestmark = pytest.mark.unit


def test_no_snapshot_under_way_shows_nothing() -> None:
    done = {"state": "streaming", "snapshot_rows_done": 100, "snapshot_rows_total": 100, "snapshot_method": "chunked"}
    assert snapshot_summary(done) is None
    assert snapshot_view(done) is None
    assert snapshot_view(SourceStatus(name="s", slot="x").to_json()) is None


def test_a_consistent_snapshot_while_snapshotting() -> None:
    status = SourceStatus(name="s", slot="x", state=SourceState.SNAPSHOTTING)
    status.snapshot_table, status.snapshot_rows_done, status.snapshot_rows_total = "public.t", 250, 1000
    entry = status.to_json()
    assert snapshot_summary(entry) == "snapshot public.t 250/~1,000 rows (25%)"
    assert snapshot_view(entry) == {
        "method": "consistent",
        "table": "public.t",
        "chunks_done": 0,
        "rows_done": 250,
        "rows_estimated": 1000,
        "tables_pending": [],
        "paused": False,
    }


def test_a_chunked_snapshot_beside_streaming_with_tables_pending() -> None:
    entry = {
        "state": "streaming",
        "snapshot_method": "chunked",
        "snapshot_table": "public.a",
        "snapshot_chunk": 12,
        "snapshot_rows_done": 120_000,
        "snapshot_rows_total": 2_000_000,
        "snapshot_tables_pending": ["public.a", "public.b", "public.c", "public.d", "public.e"],
    }
    assert snapshot_summary(entry) == (
        "snapshot (chunked) public.a chunk 12 120,000/~2,000,000 rows (6%) pending public.b, public.c, public.d +1"
    )
    view = snapshot_view(entry)
    assert view is not None and view["method"] == "chunked" and view["chunks_done"] == 12
    assert view["tables_pending"] == ["public.a", "public.b", "public.c", "public.d", "public.e"]


def test_a_table_added_to_include_shows_as_pending_before_its_first_chunk() -> None:
    entry = {"state": "streaming", "snapshot_method": "chunked", "snapshot_tables_pending": ["public.new"]}
    assert snapshot_summary(entry) == "snapshot (chunked) pending public.new"


def test_a_paused_snapshot_says_so_and_a_stopped_or_finished_one_shows_after_it() -> None:
    paused = {
        "state": "streaming",
        "snapshot_method": "chunked",
        "snapshot_table": "public.a",
        "snapshot_tables_pending": ["public.a"],
        "snapshot_control": "paused",
    }
    assert snapshot_summary(paused) == "snapshot (chunked) paused public.a"
    view = snapshot_view(paused)
    assert view is not None and view["paused"] is True
    stopped = {"state": "streaming", "snapshot_method": "chunked", "snapshot_control": "stopped"}
    assert snapshot_summary(stopped) == "snapshot stopped" and snapshot_view(stopped) is None
    finished = {"state": "stopped", "snapshot_method": "consistent", "snapshot_control": "finished"}
    assert snapshot_summary(finished) == "snapshot finished (initial_only): not streaming"
