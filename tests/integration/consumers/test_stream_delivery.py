"""How a stream learns about its group without a database round trip per batch (rebalance notices),
and how a waiting stream learns that the log committed (the manifest watch), against a real
PostgreSQL and a real log."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path

import pytest

from tests.integration.capture.helpers import wait_for
from tests.integration.projections.helpers import LogWriter
from tests.waiting import wait_progress
from tributary.consumers import Fenced, GroupCoordinator, LogChanges, StreamCursor
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.integration

TOPIC = "events.account"


@pytest.fixture
def service(fresh_db: str) -> str:
    run_migrations(fresh_db)
    return fresh_db


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[LogWriter]:
    w = LogWriter(tmp_path / "log")
    w.topic(TOPIC, partitions=4)
    yield w
    w.close()


@pytest.fixture
def coordinator(service: str, tmp_path: Path, writer: LogWriter) -> Iterator[GroupCoordinator]:
    with GroupCoordinator(service, tmp_path / "log", poll_interval_ms=0, auto_offset_reset="earliest") as c:
        yield c


def write(writer: LogWriter, n: int, *, start: int = 0) -> None:
    for i in range(start, start + n):
        writer.append(TOPIC, f"acct-{i % 10}", i, "Deposited", 1_700_000_000_000 + i, amount=i)
    writer.commit()


async def _until(check: Callable[[], bool], progress: Callable[[], Hashable], what: str) -> None:
    """Wait for `check()` while `progress()` moves (tests/waiting.py), the event loop running on."""
    await asyncio.to_thread(wait_progress, check, progress, what=what, poll=0.01)


def listening(c: GroupCoordinator) -> None:
    c.notices.start()
    wait_for(lambda: c.notices.listening, what="the rebalance listener", progress=lambda: None)


def test_a_stream_asks_the_database_only_when_it_must(coordinator: GroupCoordinator, writer: LogWriter) -> None:
    write(writer, 200)
    listening(coordinator)
    m = coordinator.join("g", [TOPIC], member_id="a", session_timeout_ms=60_000)
    cursor = StreamCursor("g", "a", m.generation)
    got: list[tuple[int, int]] = []
    batches = 0
    started = time.monotonic()
    while batch := coordinator.stream_fetch(cursor, max_records=5):
        if not batch.records:
            break
        batches += 1
        got += [(r.partition, r.offset) for r in batch.records]
    assert len(got) == 200 == len(set(got))
    for p in range(4):
        offsets = [o for q, o in got if q == p]
        assert offsets == list(range(len(offsets)))  # every partition in offset order, from its start
    # one check per beat (a second at most) instead of one per batch
    assert batches >= 40
    assert cursor.checks <= 2 + int(time.monotonic() - started)


def test_a_rebalance_reaches_an_open_stream_through_its_notice(
    service: str, tmp_path: Path, coordinator: GroupCoordinator, writer: LogWriter
) -> None:
    write(writer, 40)
    listening(coordinator)
    a = coordinator.join("g", [TOPIC], member_id="a", session_timeout_ms=60_000)
    cursor = StreamCursor("g", "a", a.generation)
    first = coordinator.stream_fetch(cursor, max_records=1000)
    assert len(first.records) == 40 and cursor.checks == 1
    with GroupCoordinator(service, tmp_path / "log", auto_offset_reset="earliest") as other:  # another process
        b = other.join("g", [TOPIC], member_id="b", session_timeout_ms=60_000)
        joined = time.monotonic()
        with pytest.raises(Fenced) as fenced:
            while time.monotonic() - joined < 5:
                coordinator.stream_fetch(cursor, max_records=1000)
        # well before the stream's next check by the clock (a second after the previous one)
        assert time.monotonic() - joined < 0.6
        assert fenced.value.generation == b.generation
        with pytest.raises(Fenced):  # and the stale generation still cannot commit
            coordinator.commit("g", "a", a.generation, [(TOPIC, 0, 1)])


def test_without_notices_every_batch_asks_the_database(coordinator: GroupCoordinator, writer: LogWriter) -> None:
    write(writer, 30)
    coordinator.notices.close()  # never listens from now on
    m = coordinator.join("g", [TOPIC], member_id="a", session_timeout_ms=60_000)
    cursor = StreamCursor("g", "a", m.generation)
    batches = 0
    while coordinator.stream_fetch(cursor, max_records=4).records:
        batches += 1
    assert batches >= 8 and cursor.checks == batches + 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the manifest watch uses Linux inotify")
def test_a_waiting_stream_wakes_when_the_log_commits_not_on_the_next_poll(
    coordinator: GroupCoordinator, writer: LogWriter
) -> None:
    async def go() -> float:
        changes = LogChanges(coordinator.view, interval_s=30)  # a poll would come far too late
        try:
            coordinator.view.refresh()
            seen = coordinator.view.version
            loop = asyncio.get_running_loop()
            waiting = asyncio.create_task(changes.wait(seen, 20))
            await _until(lambda: changes.watching(), lambda: changes.reads, "the watch")  # the waiter sleeps on it
            assert changes.watch is not None and changes.watch.active and not waiting.done()
            started = loop.time()
            await asyncio.to_thread(write, writer, 1)
            assert await asyncio.wait_for(waiting, 20)
            return loop.time() - started
        finally:
            await changes.close()

    assert asyncio.run(go()) < 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the manifest watch uses Linux inotify")
def test_while_the_watch_reports_changes_an_idle_wait_reads_the_manifest_rarely(
    coordinator: GroupCoordinator, writer: LogWriter
) -> None:
    async def go() -> tuple[int, float]:
        changes = LogChanges(coordinator.view, interval_s=0.01)  # without the watch: 100 reads a second
        try:
            coordinator.view.refresh()
            seen = coordinator.view.version
            loop = asyncio.get_running_loop()
            waiting = asyncio.create_task(changes.wait(seen, 20))
            await asyncio.sleep(2.0)
            assert changes.watching() and not waiting.done()
            reads = changes.reads
            started = loop.time()
            await asyncio.to_thread(write, writer, 1)
            assert await asyncio.wait_for(waiting, 20)
            return reads, loop.time() - started
        finally:
            await changes.close()

    reads, woke_after = asyncio.run(go())
    assert reads <= 4, reads  # the first read, then the safety re-read once a second
    assert woke_after < 0.5  # a commit still wakes the waiter at once


def test_without_the_watch_the_manifest_is_polled_every_interval(service: str, tmp_path: Path) -> None:
    root = tmp_path / "later"  # the log's directory does not exist yet: nothing to watch

    async def go() -> tuple[int, bool]:
        with GroupCoordinator(service, root, poll_interval_ms=0) as c:
            changes = LogChanges(c.view, interval_s=0.01)
            try:
                waiting = asyncio.create_task(changes.wait(c.view.version, 20))
                await asyncio.sleep(0.5)
                reads = changes.reads
                w = LogWriter(root)
                try:
                    await asyncio.to_thread(w.topic, TOPIC, 1)
                    await asyncio.to_thread(write, w, 1)
                    woke = await waiting  # (False after its 20 s)
                finally:
                    w.close()
                return reads, woke
            finally:
                await changes.close()

    reads, woke = asyncio.run(go())
    assert reads >= 10, reads
    assert woke


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the manifest watch uses Linux inotify")
def test_a_watch_that_misses_a_change_is_no_longer_relied_on(coordinator: GroupCoordinator, writer: LogWriter) -> None:
    async def go() -> tuple[bool, int, int]:
        changes = LogChanges(coordinator.view, interval_s=0.01, watched_interval_s=0.2)
        try:
            coordinator.view.refresh()
            waiting = asyncio.create_task(changes.wait(coordinator.view.version, 20))
            await _until(lambda: changes.watching(), lambda: changes.reads, "the watch")
            assert changes.watch is not None and changes.watching()
            # the file system stops reporting (as a network file system's remote writes never do)
            asyncio.get_running_loop().remove_reader(changes.watch._fd)
            await asyncio.to_thread(write, writer, 1)
            assert await waiting  # the safety re-read found it (False: not within its 20 s)
            await asyncio.sleep(0.2)
            waiting = asyncio.create_task(changes.wait(coordinator.view.version, 20))
            await asyncio.sleep(0.1)
            before = changes.reads
            await asyncio.sleep(0.5)
            return changes.trusted, before, changes.reads
        finally:
            waiting.cancel()
            await changes.close()

    trusted, before, after = asyncio.run(go())
    assert not trusted
    assert after - before >= 10  # polled every interval from then on
