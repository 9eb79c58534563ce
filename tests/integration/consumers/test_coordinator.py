"""The group coordinator against a real PostgreSQL and a real log: membership, rebalancing, fencing,
delivery order, durable offsets, replay, retention."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests import waiting
from tests.integration.projections.helpers import LogWriter
from tributary.consumers import (
    ConsumerError,
    Fenced,
    GroupBusy,
    GroupCoordinator,
    NotAssigned,
    OffsetOutOfRange,
    UnknownMember,
)
from tributary.eventstore.migrate import run_migrations
from tributary.log.local import Log, TopicConfig, canonical_json

pytestmark = pytest.mark.integration

TOPIC = "events.account"


@pytest.fixture
def service(fresh_db: str) -> str:
    run_migrations(fresh_db)
    return fresh_db


@pytest.fixture
def log_root(tmp_path: Path) -> Path:
    return tmp_path / "log"


@pytest.fixture
def writer(log_root: Path) -> Iterator[LogWriter]:
    w = LogWriter(log_root)
    w.topic(TOPIC, partitions=4)
    yield w
    w.close()


@pytest.fixture
def coordinator(service: str, log_root: Path, writer: LogWriter) -> Iterator[GroupCoordinator]:
    with GroupCoordinator(service, log_root, poll_interval_ms=0, auto_offset_reset="earliest") as c:
        yield c


def write(writer: LogWriter, n: int, *, start: int = 0, at_ms: int = 1_700_000_000_000) -> None:
    for i in range(start, start + n):
        writer.append(TOPIC, f"acct-{i % 10}", i, "Deposited", at_ms + i, amount=i)
    writer.commit()


def drain(c: GroupCoordinator, group: str, member: str, generation: int) -> list[tuple[int, int, int]]:
    """(partition, offset, amount) of everything the member gets until a fetch comes back empty."""
    import orjson

    out = []
    while True:
        batch = c.fetch(group, member, generation, max_records=7)
        if not batch.records:
            return out
        out += [(r.partition, r.offset, orjson.loads(r.value or b"null")["data"]["amount"]) for r in batch.records]


def test_members_divide_the_partitions_and_rebalance_on_join_and_leave(coordinator: GroupCoordinator) -> None:
    a = coordinator.join("g", [TOPIC], member_id="a")
    assert a.assignments == [(TOPIC, p) for p in range(4)]
    b = coordinator.join("g", [TOPIC], member_id="b")
    assert b.generation == a.generation + 1
    beat = coordinator.heartbeat("g", "a", a.generation)
    assert beat.rebalance and beat.generation == b.generation
    assert sorted(beat.assignments + b.assignments) == [(TOPIC, p) for p in range(4)]
    assert len(beat.assignments) == len(b.assignments) == 2
    again = coordinator.join("g", [TOPIC], member_id="b")  # a re-join with the same subscription
    assert again.generation == b.generation and again.assignments == b.assignments
    coordinator.leave("g", "b")
    beat = coordinator.heartbeat("g", "a", b.generation)
    assert beat.rebalance and beat.assignments == [(TOPIC, p) for p in range(4)]
    with pytest.raises(UnknownMember):
        coordinator.heartbeat("g", "b", beat.generation)


def test_a_member_past_its_session_timeout_loses_its_partitions(coordinator: GroupCoordinator) -> None:
    a = coordinator.join("g", [TOPIC], member_id="a", session_timeout_ms=10_000)
    coordinator.join("g", [TOPIC], member_id="b", session_timeout_ms=300)
    time.sleep(0.5)  # b sends no heartbeat
    beat = coordinator.heartbeat("g", "a", a.generation + 1)
    assert beat.rebalance and beat.assignments == [(TOPIC, p) for p in range(4)]
    with pytest.raises(UnknownMember):
        coordinator.fetch("g", "b", beat.generation)


def test_the_sweeper_moves_a_silent_members_partitions(coordinator: GroupCoordinator) -> None:
    coordinator.join("g", [TOPIC], member_id="b", session_timeout_ms=10_000)
    swept: list[list[str]] = []

    def alive_sweep() -> bool:
        """A sweep within a's session: when the machine stalls past it, a joins again and the sweep repeats."""
        started = time.monotonic()
        coordinator.join("g", [TOPIC], member_id="a", session_timeout_ms=300)
        swept.append(coordinator.sweep())
        return time.monotonic() - started < 0.3

    waiting.wait_progress(alive_sweep, lambda: None, what="a join and a sweep within a 0.3 s session")
    assert swept[-1] == []
    time.sleep(0.5)  # nobody calls: only the sweeper notices that a is gone
    assert coordinator.sweep() == ["g"]
    described = coordinator.describe("g")
    assert described is not None
    assert [m["member_id"] for m in described["members"]] == ["b"]
    assert {x["member"] for x in described["partitions"]} == {"b"}


def test_a_stale_generation_cannot_commit_or_fetch(coordinator: GroupCoordinator, writer: LogWriter) -> None:
    write(writer, 20)
    a = coordinator.join("g", [TOPIC], member_id="a")
    batch = coordinator.fetch("g", "a", a.generation)
    assert len(batch.records) == 20
    coordinator.join("g", [TOPIC], member_id="b")  # a rebalance: generation + 1
    with pytest.raises(Fenced) as fenced:
        coordinator.commit("g", "a", a.generation, [(TOPIC, 0, 3)])
    assert fenced.value.generation == a.generation + 1
    with pytest.raises(Fenced):
        coordinator.fetch("g", "a", a.generation)
    beat = coordinator.heartbeat("g", "a", a.generation)
    mine = beat.assignments[0]
    theirs = next(tp for tp in [(TOPIC, p) for p in range(4)] if tp not in beat.assignments)
    coordinator.commit("g", "a", beat.generation, [(*mine, 1)])
    with pytest.raises(NotAssigned):
        coordinator.commit("g", "a", beat.generation, [(*theirs, 1)])
    described = coordinator.describe("g")
    assert described is not None
    committed = {(x["topic"], x["partition"]): x["committed"] for x in described["partitions"]}
    assert committed[mine] == 1 and committed[theirs] is None


def test_delivery_is_in_offset_order_per_partition_and_each_record_once(
    coordinator: GroupCoordinator, writer: LogWriter
) -> None:
    write(writer, 50)
    a = coordinator.join("g", [TOPIC], member_id="a")
    got = drain(coordinator, "g", "a", a.generation)
    assert sorted(x[2] for x in got) == list(range(50))
    for p in range(4):
        offsets = [o for part, o, _ in got if part == p]
        assert offsets == sorted(offsets) and offsets == list(range(len(offsets)))
    write(writer, 5, start=50)
    assert sorted(x[2] for x in drain(coordinator, "g", "a", a.generation)) == list(range(50, 55))


@pytest.mark.parametrize("processes", [1, 2], ids=["one coordinator", "two coordinators"])
def test_concurrent_pulls_of_one_member_hand_out_every_record_once(
    coordinator: GroupCoordinator, service: str, log_root: Path, writer: LogWriter, processes: int
) -> None:
    write(writer, 600)
    m = coordinator.join("g", [TOPIC], member_id="a", session_timeout_ms=60_000)
    # a second coordinator (its own connections and log view) stands for another `[api] workers` process
    other = GroupCoordinator(service, log_root, poll_interval_ms=0, auto_offset_reset="earliest")
    pullers = [coordinator, other if processes == 2 else coordinator]
    got: list[list[tuple[int, int]]] = [[], []]
    start = threading.Barrier(2)
    failures: list[BaseException] = []

    def pull(i: int) -> None:
        try:
            start.wait()
            while True:
                batch = pullers[i].fetch("g", "a", m.generation, max_records=3)
                if not batch.records:
                    return
                got[i] += [(r.partition, r.offset) for r in batch.records]
        except BaseException as exc:  # reported below, with the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=pull, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        waiting.wait_threads(threads, what="both pulls", progress=lambda: (len(got[0]), len(got[1])))
    finally:
        other.close()
    assert not failures, failures
    everything = got[0] + got[1]
    assert len(everything) == len(set(everything)) == 600  # every record once: none twice, none missing
    assert got[0] and got[1]  # both pulled (else the test would not test the race)
    for mine in got:  # each pull's records are in offset order per partition
        for p in range(4):
            offsets = [o for q, o in mine if q == p]
            assert offsets == sorted(offsets)


def test_groups_fan_out_and_members_of_one_group_share(coordinator: GroupCoordinator, writer: LogWriter) -> None:
    write(writer, 40)
    one = coordinator.join("one", [TOPIC], member_id="x")
    two_a = coordinator.join("two", [TOPIC], member_id="a")
    two_b = coordinator.join("two", [TOPIC], member_id="b")
    two_a_gen = coordinator.heartbeat("two", "a", two_a.generation).generation
    all_one = drain(coordinator, "one", "x", one.generation)
    got_a = drain(coordinator, "two", "a", two_a_gen)
    got_b = drain(coordinator, "two", "b", two_b.generation)
    assert sorted(x[2] for x in all_one) == list(range(40))
    assert sorted(x[2] for x in got_a + got_b) == list(range(40))
    assert {x[0] for x in got_a}.isdisjoint({x[0] for x in got_b})


def test_committed_offsets_survive_a_new_coordinator_and_redelivery_starts_there(
    service: str, log_root: Path, writer: LogWriter
) -> None:
    write(writer, 30)
    with GroupCoordinator(service, log_root, poll_interval_ms=0, auto_offset_reset="earliest") as c:
        m = c.join("g", [TOPIC], member_id="a")
        batch = c.fetch("g", "a", m.generation, max_records=1000)
        last = {}
        for r in batch.records[:10]:
            last[(r.topic, r.partition)] = r.offset + 1
        c.commit("g", "a", m.generation, [(t, p, o) for (t, p), o in last.items()])
    with GroupCoordinator(service, log_root, poll_interval_ms=0, auto_offset_reset="earliest") as c:
        m = c.join("g", [TOPIC], member_id="z")  # a new member: the old one is still in its session
        beat = c.heartbeat("g", "z", m.generation)
        got = drain(c, "g", "z", beat.generation)
        for p, offset, _ in got:
            assert offset >= last.get((TOPIC, p), 0)
        first = {p: min(o for q, o, _ in got if q == p) for p in {q for q, _, _ in got}}
        for (_, p), o in last.items():
            if p in first:
                assert first[p] == o


def test_auto_commit_commits_what_earlier_fetches_returned(coordinator: GroupCoordinator, writer: LogWriter) -> None:
    write(writer, 12)
    m = coordinator.join("g", [TOPIC], member_id="a", auto_commit=True)
    first = coordinator.fetch("g", "a", m.generation, max_records=100)
    assert len(first.records) == 12
    coordinator.fetch("g", "a", m.generation)  # the next fetch commits what the first returned
    described = coordinator.describe("g")
    assert described is not None
    assert described["lag"] == 0


def test_resets_to_earliest_latest_datetime_and_offset(coordinator: GroupCoordinator, writer: LogWriter) -> None:
    write(writer, 40, at_ms=1_000_000)
    m = coordinator.join("g", [TOPIC], member_id="a")
    with pytest.raises(GroupBusy):
        coordinator.reset("g", "earliest")
    coordinator.leave("g", "a")
    ends = coordinator.reset("g", "latest")
    assert sum(x["offset"] for x in ends) == 40
    m = coordinator.join("g", [TOPIC], member_id="a")
    assert drain(coordinator, "g", "a", m.generation) == []
    coordinator.leave("g", "a")
    assert {x["offset"] for x in coordinator.reset("g", "earliest")} == {0}
    at = coordinator.reset("g", "datetime", timestamp_ms=1_000_030)
    m = coordinator.join("g", [TOPIC], member_id="a")
    assert sorted(x[2] for x in drain(coordinator, "g", "a", m.generation)) == list(range(30, 40))
    coordinator.leave("g", "a")
    assert sum(x["offset"] for x in at) == 30
    clamped = coordinator.reset("g", "offset", offset=10**9, topic=TOPIC)
    assert [x["offset"] for x in clamped] == [x["offset"] for x in ends]
    dry = coordinator.reset("g", "earliest", dry_run=True)
    assert {x["offset"] for x in dry} == {0}
    assert [x["offset"] for x in coordinator.reset("g", "offset", offset=2)] == [2, 2, 2, 2]
    with pytest.raises(ConsumerError):
        coordinator.reset("g", "earliest", topic="no.such.topic")


@pytest.fixture
def retained(log_root: Path) -> Iterator[Log]:
    """A topic whose first segments retention removes (segments of 4 KiB, 1 partition)."""
    log = Log.open(log_root, writer=True, segment_bytes=4096)
    log.create_topic("short", TopicConfig(partitions=1, retention_ms=1000))
    key = canonical_json("k")
    for i in range(200):
        log.append("short", 0, [(key, b'{"i":%d}' % i, 1000 + i, None)])
    log.commit()
    yield log
    log.close()


@pytest.mark.parametrize("policy", ["earliest", "latest", "error"])
def test_a_position_behind_retention_follows_auto_offset_reset(
    service: str, log_root: Path, retained: Log, policy: str
) -> None:
    with GroupCoordinator(service, log_root, poll_interval_ms=0) as c:
        m = c.join("g", ["short"], member_id="a", auto_offset_reset="earliest")
        batch = c.fetch("g", "a", m.generation, max_records=5)
        c.commit("g", "a", m.generation, [("short", 0, batch.records[-1].offset + 1)])
        c.leave("g", "a")
        assert retained.enforce_retention(now_ms=10_000) > 0
        start, end = retained.start_offsets("short")[0], retained.end_offsets("short")[0]
        assert start > 5
        m = c.join("g", ["short"], member_id="a", auto_offset_reset=policy)  # type: ignore[arg-type]
        if policy == "error":
            with pytest.raises(OffsetOutOfRange) as err:
                c.fetch("g", "a", m.generation)
            assert err.value.position == 5 and err.value.start == start
            return
        batch = c.fetch("g", "a", m.generation, max_records=1000)
        assert batch.resets and batch.resets[0]["position"] == 5
        if policy == "earliest":
            assert batch.records[0].offset == start and batch.records[-1].offset == end - 1
        else:
            assert batch.records == []
        described = c.describe("g")
        assert described is not None
        assert described["partitions"][0]["out_of_range"]["action"] == policy


def test_consumer_tables_are_in_schema_consumers(service: str) -> None:
    with psycopg.connect(service) as conn:
        names = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'consumers'")}
    assert {"groups", "members", "assignments", "offsets", "out_of_range"} <= names


def test_a_topic_that_appears_later_is_assigned_by_the_sweeper(
    coordinator: GroupCoordinator, writer: LogWriter
) -> None:
    m = coordinator.join("g", ["later.topic"], member_id="a")
    assert m.assignments == []
    writer.topic("later.topic", partitions=2)
    writer.append("later.topic", "k", 1, "Opened", 1)
    writer.commit()
    assert coordinator.sweep() == ["g"]
    beat = coordinator.heartbeat("g", "a", m.generation)
    assert beat.rebalance and beat.assignments == [("later.topic", 0), ("later.topic", 1)]
    assert len(coordinator.fetch("g", "a", beat.generation).records) == 1


def test_a_partition_that_stays_keeps_its_position_and_a_moved_one_restarts_at_the_commit(
    coordinator: GroupCoordinator, writer: LogWriter
) -> None:
    write(writer, 40)
    a = coordinator.join("g", [TOPIC], member_id="a")
    first = coordinator.fetch("g", "a", a.generation, max_records=1000).records
    coordinator.commit("g", "a", a.generation, [(TOPIC, p, 1) for p in range(4)])
    b = coordinator.join("g", [TOPIC], member_id="b")
    beat = coordinator.heartbeat("g", "a", a.generation)
    assert coordinator.fetch("g", "a", beat.generation).records == []  # a's partitions: delivered already
    again = coordinator.fetch("g", "b", b.generation, max_records=1000).records
    expected = [r for r in first if (r.topic, r.partition) in b.assignments and r.offset >= 1]
    assert [(r.partition, r.offset) for r in again] != [] and sorted(
        again, key=lambda r: (r.partition, r.offset)
    ) == sorted(expected, key=lambda r: (r.partition, r.offset))
    # a re-join restarts delivery at the committed offsets
    rejoined = coordinator.join("g", [TOPIC], member_id="a")
    assert rejoined.generation == beat.generation
    redelivered = coordinator.fetch("g", "a", rejoined.generation, max_records=1000).records
    assert {r.offset for r in redelivered if r.offset == 0} == set() and redelivered


def test_three_members_one_goes_silent_nothing_lost_order_kept(
    coordinator: GroupCoordinator, writer: LogWriter
) -> None:
    """Three members consume and commit concurrently; one stops mid-stream without leaving (as after
    kill -9). Its partitions move within the session timeout, every record is processed, each
    member sees each partition's offsets in order within a generation, and a record processed twice
    was never committed before its second delivery."""
    import threading

    write(writer, 600)
    processed: list[tuple[str, int, int, int]] = []  # member, generation, partition, offset
    committed_when: dict[tuple[int, int], int] = {}  # (partition, offset) -> times it was below the commit
    lock = threading.Lock()
    stop = threading.Event()
    silent_at = threading.Event()

    def member(name: str, silent_after: int | None) -> None:
        m = coordinator.join("g", [TOPIC], member_id=name, session_timeout_ms=600)
        generation, seen = m.generation, 0
        while not stop.is_set():
            try:
                generation = coordinator.heartbeat("g", name, generation).generation
                batch = coordinator.fetch("g", name, generation, max_records=15)
                done: dict[tuple[str, int], int] = {}
                with lock:
                    for r in batch.records:
                        processed.append((name, generation, r.partition, r.offset))
                        done[(r.topic, r.partition)] = r.offset + 1
                if done:
                    coordinator.commit("g", name, generation, [(t, p, o) for (t, p), o in done.items()])
                    with lock:
                        for (_, p), o in done.items():
                            for off in range(o):
                                committed_when.setdefault((p, off), len(processed))
                seen += len(batch.records)
            except (Fenced, UnknownMember, NotAssigned):
                if stop.is_set():
                    return
                m = coordinator.join("g", [TOPIC], member_id=name, session_timeout_ms=600)
                generation = m.generation
                continue
            if silent_after is not None and seen >= silent_after:
                silent_at.set()
                return  # gone without a word: no leave, no more heartbeats
            time.sleep(0.02)

    threads = [threading.Thread(target=member, args=(n, 60 if n == "m2" else None)) for n in ("m0", "m1", "m2")]
    for t in threads:
        t.start()

    def committed() -> list[tuple[int, int | None, int]]:
        parts = (coordinator.describe("g") or {"partitions": []})["partitions"]  # None until the first join
        return [(x["partition"], x["committed"], x["end"]) for x in parts]

    def everything_committed() -> bool:
        parts = committed()
        return silent_at.is_set() and len(parts) == 4 and all(c == end for _, c, end in parts)

    try:
        waiting.wait_progress(
            everything_committed,
            lambda: (len(processed), tuple(committed())),
            what="every record committed after m2 went silent",
        )
    finally:
        stop.set()
        waiting.wait_threads(threads, what="the members to stop", progress=lambda: len(processed))
    assert {(p, o) for _, _, p, o in processed} == {(r[0], r[1]) for r in _all_offsets(coordinator)}
    assert {m["member_id"] for m in (coordinator.describe("g") or {})["members"]} <= {"m0", "m1"}
    by_run: dict[tuple[str, int, int], list[int]] = {}
    for name, gen, p, o in processed:
        by_run.setdefault((name, gen, p), []).append(o)
    for offsets in by_run.values():
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    deliveries: dict[tuple[int, int], list[int]] = {}
    for i, (_, _, p, o) in enumerate(processed):
        deliveries.setdefault((p, o), []).append(i)
    for key, at in deliveries.items():
        if len(at) > 1:  # redelivered: the commit covering it came only after its second delivery
            assert committed_when.get(key, len(processed) + 1) > at[1], key


def _all_offsets(c: GroupCoordinator) -> list[tuple[int, int]]:
    return [(p, o) for p in range(4) for o in range(*c.view.bounds(TOPIC, p))]
