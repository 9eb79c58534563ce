"""Topic owners: writer processes beside capture on one root, each committing its own topics."""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path

import pytest

from tributary.log import open_writer
from tributary.log.local import Log, LogError, LogLockedError, MissingMetadataError, TopicConfig, admin, owners

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from crash_writer import PARTS, kill, spawn, value  # noqa: E402


def _wait_for_data(root: Path, topics: list[str], deadline_s: float = 120.0) -> None:
    """Until a reader sees committed records in every one of `topics` (progress, not wall-clock speed)."""
    stop = time.monotonic() + deadline_s
    while time.monotonic() < stop:
        if root.is_dir():
            try:
                with Log.open(root) as log:
                    have = log.topics()
                    if all(t in have and sum(log.end_offsets(t)) > 0 for t in topics):
                        return
            except LogError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"no committed records in {topics} after {deadline_s} s")


def _check_recovered(
    root: Path, owner: str | None, topic: str, got: tuple[list[int], list[int], int], floor: list[int]
) -> list[int]:
    """Reopen the owner's writer (recovery): every committed record is there byte for byte and
    nothing uncommitted is, and its own source position too; returns the ends."""
    committed, intent, n = got
    with Log.open(root, writer=True, owner=owner) as log:
        if n:
            assert int(log.positions()["src"]) >= n
        ends = log.end_offsets(topic)
        for p in range(PARTS):
            done = max(committed[p], floor[p])
            assert done <= ends[p], f"{topic}/{p}: committed data lost"
            assert ends[p] <= max(intent[p], done), f"{topic}/{p}: uncommitted data visible"
            records = [(r.offset, r.value) for r in log.read(topic, p, 0)]
            assert records == [(o, value(p, o)) for o in range(ends[p])], f"{topic}/{p}: damaged or duplicated"
        return ends


def test_two_owners_write_concurrently_and_survive_kill_minus_9(tmp_path: Path) -> None:
    root = tmp_path / "log"
    rnd = random.Random(20261129)
    floors = {"t": [0] * PARTS, "derived": [0] * PARTS}
    for run in range(6):
        capture = spawn(root, seed=run)
        named = spawn(root, seed=100 + run, owner="projection.orders", topic="derived")
        try:
            _wait_for_data(root, ["t", "derived"])
            time.sleep(rnd.uniform(0.0, 0.3))  # a random moment of the named owner's run
        finally:
            got_named = kill(named)
            got_capture = kill(capture)
        floors["derived"] = _check_recovered(root, "projection.orders", "derived", got_named, floors["derived"])
        floors["t"] = _check_recovered(root, None, "t", got_capture, floors["t"])
        with Log.open(root) as reader:  # one reader sees both owners' committed topics
            assert set(reader.topics()) == {"t", "derived"}
            assert reader.end_offsets("derived") == floors["derived"]
            assert reader.end_offsets("t") == floors["t"]
            assert reader.verify() == []
    assert sum(floors["derived"]) > 0 and sum(floors["t"]) > 0
    listed = {t["topic"]: t["records"] for t in admin.topics(root)}
    assert listed == {"t": sum(floors["t"]), "derived": sum(floors["derived"])}


def test_a_topic_belongs_to_its_creator(tmp_path: Path) -> None:
    root = tmp_path / "log"
    with Log.open(root, writer=True) as capture, Log.open(root, writer=True, owner="groups") as groups:
        capture.create_topic("orders", TopicConfig(partitions=1))
        groups.create_topic("orders.parked", TopicConfig(partitions=1))
        with pytest.raises(
            LogError, match=r"'orders' .* is written by the default writer \(capture\), not by owner 'groups'"
        ):
            groups.append("orders", 0, [(None, b"{}", 1, None)])
        with pytest.raises(LogError, match=r"'orders.parked' .* is written by owner 'groups'"):
            capture.append("orders.parked", 0, [(None, b"{}", 1, None)])
        with pytest.raises(LogError, match="is written by owner 'groups'"):
            capture.create_topic("orders.parked")
        with pytest.raises(LogLockedError, match="owner 'groups'"):
            Log.open(root, writer=True, owner="groups")
        groups.append("orders.parked", 0, [(None, b'{"n":1}', 1, None)])
        groups.commit(positions={"groups": "1"})
        assert capture.positions() == {} and groups.positions() == {"groups": "1"}  # each its own
    with Log.open(root) as reader:
        assert [r.value for r in reader.read("orders.parked", 0)] == [b'{"n":1}']


def _race(logs: list[Log], name: str) -> tuple[list[int], list[str]]:
    """Every writer of `logs` creates topic `name` at once (each on its own thread): who won, what the others heard."""
    barrier = threading.Barrier(len(logs))
    won: list[int] = []
    lost: list[str] = []

    def create(i: int) -> None:
        barrier.wait()
        try:
            logs[i].create_topic(name, TopicConfig(partitions=1))
            won.append(i)
        except LogError as exc:
            lost.append(str(exc))

    threads = [threading.Thread(target=create, args=(i,)) for i in range(len(logs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, lost


def test_claim_race_has_one_winner(tmp_path: Path) -> None:
    root = tmp_path / "log"
    logs = [Log.open(root, writer=True, owner=o) for o in (None, "a", "b", "c")]
    try:
        for round_ in range(25):
            won, lost = _race(logs, f"race{round_}")
            assert len(won) == 1, (won, lost)
            assert len(lost) == len(logs) - 1 and all("is written by" in m for m in lost)
        with Log.open(root) as reader:
            assert len(reader.topics()) == 25
    finally:
        for log in logs:
            log.close()


def _stale_claims(root: Path, owner: str, topics: list[str]) -> None:
    """Claims of `owner` on `topics` as a writer leaves them that crashed between its claim and the
    commit that lists the topic: claimed, never committed, the owner's lock free."""
    with Log.open(root, writer=True, owner=owner):
        for t in topics:
            (root / t).mkdir()
            assert owners.claim(root / t, owner) == owner


def test_a_stale_claim_is_taken_over_and_a_live_or_committed_one_is_not(tmp_path: Path) -> None:
    root = tmp_path / "log"
    _stale_claims(root, "dead", ["orphan", "held"])
    with Log.open(root, writer=True, owner="kept") as kept:
        kept.create_topic("committed", TopicConfig(partitions=1))  # listed in its manifest: a real claim
    with (
        Log.open(root, writer=True, owner="dead"),
        Log.open(root, writer=True, owner="groups") as groups,
        pytest.raises(LogError, match="'held' .* is written by owner 'dead'"),
    ):
        groups.create_topic("held")  # its owner runs (holds its lock): the claim stands
    with Log.open(root, writer=True, owner="groups") as groups:
        groups.create_topic("orphan", TopicConfig(partitions=1))
        groups.append("orphan", 0, [(None, b'{"n":1}', 1, None)])
        groups.commit()
        with pytest.raises(LogError, match="'committed' .* is written by owner 'kept'"):
            groups.create_topic("committed")
    assert owners.claimed_by(root, "orphan") == "groups"
    with Log.open(root, writer=True, owner="dead") as dead, pytest.raises(LogError, match="owner 'groups'"):
        dead.create_topic("orphan")  # back again: the topic is not its own any more
    with Log.open(root) as reader:
        assert [r.value for r in reader.read("orphan", 0)] == [b'{"n":1}']


def test_a_stale_claim_race_has_one_winner(tmp_path: Path) -> None:
    root = tmp_path / "log"
    names = [f"race{round_}" for round_ in range(25)]
    _stale_claims(root, "dead", names)
    logs = [Log.open(root, writer=True, owner=o) for o in (None, "a", "b", "c")]
    try:
        for name in names:
            won, lost = _race(logs, name)
            assert len(won) == 1, (won, lost)
            assert len(lost) == len(logs) - 1 and all("is written by" in m for m in lost)
            assert owners.claimed_by(root, name) == (logs[won[0]].owner)
        with Log.open(root) as reader:
            assert len(reader.topics()) == 25
    finally:
        for log in logs:
            log.close()


def test_unclaimed_topic_of_an_older_log_stays_capture_s(tmp_path: Path) -> None:
    root = tmp_path / "log"
    with Log.open(root, writer=True) as capture:
        capture.create_topic("old", TopicConfig(partitions=1))
    (root / "old" / ".owner").unlink()  # as a log written before topics had owners
    with Log.open(root, writer=True, owner="groups") as groups, pytest.raises(LogError, match="default writer"):
        groups.create_topic("old")
    with Log.open(root, writer=True) as capture:
        capture.append("old", 0, [(None, b"{}", 1, None)])
        capture.commit()


def test_repair_covers_every_owner(tmp_path: Path) -> None:
    root = tmp_path / "log"
    with Log.open(root, writer=True) as capture:
        capture.create_topic("t", TopicConfig(partitions=1))
        capture.append("t", 0, [(None, b"{}", 1, None)])
        capture.commit()
    with open_writer(root=root, kafka=None, sources=[], owner="projection.x") as named:
        named.create_topic("d", TopicConfig(partitions=2))
        named.append("d", 1, [(None, b'{"a":1}', 1, None), (None, b'{"a":2}', 2, None)])
        named.commit()
    (root / ".owners" / "projection.x" / "manifest.json").unlink()
    with pytest.raises(MissingMetadataError, match="d"):
        Log.open(root)
    notes = admin.repair(root)
    assert any(n.startswith("owner 'projection.x': d: rebuilt 2 partition(s)") for n in notes), notes
    with Log.open(root) as reader:
        assert reader.end_offsets("d") == [0, 2] and reader.end_offsets("t") == [1]
    assert admin.verify(root) == []


def test_a_named_owner_waits_a_bounded_time_for_its_lock(tmp_path: Path) -> None:
    """Processes taking turns as one owner (every server process parks as `groups`): a second open
    waits for the holder to let go, and past `lock_timeout_s` refuses in one line."""
    root = tmp_path / "log"
    holder = Log.open(root, writer=True, owner="groups")
    with pytest.raises(LogLockedError, match=r"owner 'groups' of the log at .* is locked by pid \d+ \(waited 0.2s\)$"):
        Log.open(root, writer=True, owner="groups", lock_timeout_s=0.2)
    opened: list[Log] = []
    waiter = threading.Thread(
        target=lambda: opened.append(Log.open(root, writer=True, owner="groups", lock_timeout_s=600))
    )
    waiter.start()
    try:
        assert not opened  # it waits while the lock is held (its deadline is far away)
        holder.close()
        waiter.join(timeout=600)
        assert len(opened) == 1
    finally:
        holder.close()
        waiter.join(timeout=600)
        for log in opened:
            log.close()
