"""nack and park through `GroupCoordinator` on the local log: a nacked record's partition waits for its
backoff while the others go on; its attempts survive a new coordinator (a restart); past max_retries
it is parked; a reset drops pending retries."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import waiting
from tests.integration.consumers.test_coordinator import TOPIC, log_root, service, write, writer  # noqa: F401
from tests.integration.projections.helpers import LogWriter
from tributary.consumers import GroupCoordinator

pytestmark = pytest.mark.integration


@pytest.fixture
def groups(service: str, log_root: Path, writer: LogWriter) -> Iterator[GroupCoordinator]:  # noqa: F811
    with GroupCoordinator(service, log_root, poll_interval_ms=0, auto_offset_reset="earliest") as c:
        yield c


def _offsets(c: GroupCoordinator, member: str, generation: int) -> list[tuple[int, int]]:
    return [(r.partition, r.offset) for r in c.fetch("g", member, generation, max_records=1000).records]


def _until_delivered(c: GroupCoordinator, generation: int, record: tuple[int, int]) -> None:
    """Pull until `record` (partition, offset) comes back."""
    got: list[tuple[int, int]] = []
    waiting.wait_progress(
        lambda: record in got or bool(got.extend(_offsets(c, "m", generation))),
        lambda: len(got),
        what=f"record {record} again",
    )


def test_a_nacked_partition_waits_while_the_others_go_on(groups: GroupCoordinator, writer: LogWriter) -> None:  # noqa: F811
    write(writer, 20)
    me = groups.join("g", [TOPIC], member_id="m", retry_backoff_ms=60_000)
    first = _offsets(groups, "m", me.generation)
    nacked = next(po for po in first if po[1] == 1)
    [answer] = groups.nack("g", "m", me.generation, [(TOPIC, *nacked)], reason="later")
    assert (answer["action"], answer["attempts"], answer["retry_in_ms"]) == ("retry", 1, 60_000)
    write(writer, 8, start=20)
    later = _offsets(groups, "m", me.generation)
    assert later and all(p != nacked[0] for p, _ in later)  # the others go on; the nacked one waits
    ends = {p: o + 1 for p, o in first + later}
    done = groups.commit("g", "m", me.generation, [(TOPIC, p, o) for p, o in ends.items()])
    assert {(p, o) for _, p, o in done} == {*ends.items(), nacked} - {(nacked[0], ends[nacked[0]])}


def test_retries_survive_a_restart_and_end_parked(service: str, log_root: Path, writer: LogWriter) -> None:  # noqa: F811
    write(writer, 12)
    with GroupCoordinator(service, log_root, poll_interval_ms=0, auto_offset_reset="earliest") as c:
        me = c.join("g", [TOPIC], member_id="m", max_retries=2, retry_backoff_ms=50)
        nacked = _offsets(c, "m", me.generation)[0]
        assert c.nack("g", "m", me.generation, [(TOPIC, *nacked)])[0]["attempts"] == 1
    with GroupCoordinator(service, log_root, poll_interval_ms=0, auto_offset_reset="earliest") as c:
        me = c.join("g", [TOPIC], member_id="m", max_retries=2, retry_backoff_ms=50)
        for attempts, action in ((2, "retry"), (3, "parked")):
            _until_delivered(c, me.generation, nacked)
            answer = c.nack("g", "m", me.generation, [(TOPIC, *nacked)], reason="no")
            assert (answer[0]["action"], answer[0]["attempts"]) == (action, attempts)
        [parked] = c.parked("g")
        assert (parked["record"].partition, parked["record"].offset, parked["attempts"]) == (*nacked, 3)
        assert parked["reason"] == "nacked 3 times (max_retries 2): no"


def test_a_reset_drops_pending_retries(groups: GroupCoordinator, writer: LogWriter) -> None:  # noqa: F811
    write(writer, 12)
    me = groups.join("g", [TOPIC], member_id="m", retry_backoff_ms=60_000)
    nacked = _offsets(groups, "m", me.generation)[0]
    groups.nack("g", "m", me.generation, [(TOPIC, *nacked)])
    groups.leave("g", "m")
    groups.reset("g", "latest", topic=TOPIC)
    me = groups.join("g", [TOPIC], member_id="m")
    end = groups.describe("g")["partitions"][nacked[0]]["end"]  # type: ignore[index]
    done = groups.commit("g", "m", me.generation, [(TOPIC, nacked[0], end)])
    assert done == [(TOPIC, nacked[0], end)]  # not held back at the nacked record any more


def test_server_processes_park_side_by_side(service: str, log_root: Path, writer: LogWriter) -> None:  # noqa: F811
    """Two coordinators (as two `serve` workers) park at once: they take turns as the log's writer
    owner `groups` (each park waits for the other's), and every park is in the topic and listed."""
    import threading

    from tributary.consumers.parked_topic import parked_topic
    from tributary.log.local import Log

    write(writer, 40)
    with (
        GroupCoordinator(service, log_root, poll_interval_ms=0, auto_offset_reset="earliest") as one,
        GroupCoordinator(service, log_root, poll_interval_ms=0, auto_offset_reset="earliest") as two,
    ):
        one.join("g", [TOPIC], member_id="a", session_timeout_ms=60_000)
        m = two.join("g", [TOPIC], member_id="b", session_timeout_ms=60_000)
        gen = one.join("g", [TOPIC], member_id="a", session_timeout_ms=60_000).generation
        assert gen == m.generation  # a's re-join changed nothing: both hold half the partitions
        mine = {c: [(TOPIC, p, o) for p, o in _drain(c, member, gen)] for c, member in [(one, "a"), (two, "b")]}
        assert all(mine.values()) and sum(len(v) for v in mine.values()) == 40
        failed: list[BaseException] = []

        def park_all(c: GroupCoordinator, member: str) -> None:
            try:
                for ref in mine[c]:
                    c.park("g", member, gen, [ref], reason=f"by {member}")
            except BaseException as exc:  # noqa: BLE001  (reported by the test)
                failed.append(exc)

        threads = [threading.Thread(target=park_all, args=a) for a in [(one, "a"), (two, "b")]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert not failed, failed
        with Log.open(log_root) as log:
            assert sum(1 for _ in log.read(parked_topic("g"), 0)) == 40
        assert len(one.parked("g")) == 40


def _drain(c: GroupCoordinator, member: str, generation: int) -> list[tuple[int, int]]:
    """Everything the member holds, pulled until a fetch comes back empty."""
    out: list[tuple[int, int]] = []
    while batch := _offsets(c, member, generation):
        out += batch
    return out
