"""`tributary_client.Consumer` against a real `tributary serve` over a real log and Postgres: a
group dividing partitions and resuming after its commits, and the proof by breaking it (kill -9 a
member, kill -9 the server). The README's example runs where a consumer installs the client alone
(`test_standalone.py`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Hashable
from pathlib import Path

import httpx
import orjson
import pytest
from tributary_client import Consumer

from tests import waiting
from tests.integration.consumers.helpers import Filler, write_config
from tests.servers import ROOT, free_port, served
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.integration

TOPIC = "shop.public.orders"


def _read(consumer: Consumer, into: list[tuple[int, int]], want: int) -> bool:
    """One poll, its (partition, offset)s added to `into`: whether `want` of them arrived by now."""
    into.extend((r.partition, r.offset) for r in consumer.poll(300))
    return len(into) >= want


def test_group_divides_partitions_and_resumes_after_its_commits(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    filler = Filler(tmp_path / "log")
    filler.topic(TOPIC, partitions=4)
    filler.write(TOPIC, [(f"k{i}", {"id": i}) for i in range(200)])
    port = free_port()
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", port=port)
    url = f"http://127.0.0.1:{port}"
    with served(config, port, err_path=tmp_path / "serve.err"):
        a = Consumer(url, group="g", topics=[TOPIC], auto_offset_reset="earliest", wait_ms=300)
        b = Consumer(url, group="g", topics=[TOPIC], auto_offset_reset="earliest", wait_ms=300)

        def split() -> bool:
            a.poll(0)  # a fetch (and the heartbeats) notice the rebalance: the member rejoins
            b.poll(0)
            return a.assignment().isdisjoint(b.assignment()) and len(a.assignment() | b.assignment()) == 4

        waiting.wait_progress(
            split,
            lambda: (a.generation, b.generation, a.assignment(), b.assignment()),
            what="the partitions divided between the two members",
        )
        a.close()
        b.close()
        # One member reads everything in offset order per partition, commits half-way, leaves;
        # the next one starts at the commit.
        seen: dict[int, list[int]] = {}
        with Consumer(url, group="h", topics=[TOPIC], auto_offset_reset="earliest", wait_ms=300) as c:
            for got, record in enumerate(c, start=1):
                seen.setdefault(record.partition, []).append(record.offset)
                if got == 100:
                    committed = c.commit()
                    break
        assert all(o == list(range(o[0], o[0] + len(o))) and o[0] == 0 for o in seen.values())
        with Consumer(url, group="h", topics=[TOPIC], auto_offset_reset="earliest", wait_ms=300) as d:
            rest: list[tuple[int, int]] = []
            waiting.wait_progress(lambda: _read(d, rest, 100), lambda: len(rest), what="the rest")
        firsts = {p: min(o for q, o in rest if q == p) for p in {q for q, _ in rest}}
        by_partition = {tp.partition: o for tp, o in committed.items()}
        assert firsts == {p: by_partition.get(p, 0) for p in firsts}  # a partition never committed starts at 0
        assert len(rest) == 100 and len(set(rest)) == 100
    filler.close()


def _lines(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()] if path.exists() else []


def _member(url: str, group: str, out: Path) -> subprocess.Popen[bytes]:
    with out.with_suffix(".err").open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.integration.consumers.member", url, group, TOPIC, str(out), "7"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


@pytest.mark.slow
def test_kill_9_a_member_then_the_server(fresh_db: str, tmp_path: Path) -> None:
    """kill -9 one of three members mid-stream: its partitions move to the others within the session
    timeout, nothing is lost, and what they deliver again of its partitions starts at its last commit.
    Then kill -9 the server: the committed offsets survive the restart."""
    run_migrations(fresh_db)
    filler = Filler(tmp_path / "log")
    filler.topic(TOPIC, partitions=6)
    port = free_port()
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", port=port)
    url = f"http://127.0.0.1:{port}"
    outs = [tmp_path / f"m{i}.jsonl" for i in range(3)]
    total = 0
    writing = threading.Event()

    def write() -> None:  # mid-stream: records keep arriving while members read, die and take over
        nonlocal total
        while writing.is_set():
            filler.write(TOPIC, [(f"k{total + i}", {"id": total + i}) for i in range(20)])
            total += 20
            time.sleep(0.05)

    writer = threading.Thread(target=write)
    with served(config, port, err_path=tmp_path / "serve.err") as server:
        members = [_member(url, "g", out) for out in outs]
        try:
            writing.set()
            writer.start()
            waiting.wait_progress(
                lambda: all(any("p" in x for x in _lines(o)) for o in outs),
                lambda: waiting.size_of(*outs),
                what="every member busy",
            )
            victim_id = str(next(x["member"] for x in _lines(outs[0]) if "member" in x))

            def held() -> dict[str, set[int]]:
                group = httpx.get(f"{url}/groups/g", timeout=10).json()
                return {m["member_id"]: {a["partition"] for a in m["assignments"]} for m in group["members"]}

            def holdings() -> Hashable:  # the group's members and partitions: they move while it rebalances
                return tuple(sorted((m, tuple(sorted(ps))) for m, ps in held().items()))

            def victim_partitions() -> set[int]:
                now = held()
                return now.get(victim_id, set()) if len(now) == 3 and all(now.values()) else set()

            waiting.wait_progress(lambda: bool(victim_partitions()), holdings, what="a stable group of three")
            victim_parts = victim_partitions()
            victim = members[0]
            victim.send_signal(signal.SIGKILL)
            waiting.wait_exit(victim, what="the killed member")
            killed_wall = time.time()
            victim_lines = _lines(outs[0])
            commits: dict[int, int] = {}
            for x in victim_lines:
                for p, o in x.get("commit", {}).items():  # type: ignore[union-attr]
                    commits[int(p)] = int(o)

            def moved() -> set[int]:  # the victim's partitions that a survivor read from since the kill
                return {
                    int(x["p"])  # type: ignore[call-overload]
                    for o in outs[1:]
                    for x in _lines(o)
                    if x.get("p") in victim_parts and float(x["t"]) > killed_wall  # type: ignore[arg-type]
                }

            waiting.wait_progress(
                lambda: moved() == victim_parts,
                lambda: (holdings(), len(moved())),
                what="the victim's partitions read by the survivors",
            )
            after_takeover = total + 60
            waiting.wait_progress(lambda: total >= after_takeover, lambda: total, what="more records, still writing")
            writing.clear()
            writer.join()

            def seen() -> int:
                return len({(x["p"], x["o"]) for o in outs for x in _lines(o) if "p" in x})

            waiting.wait_progress(lambda: seen() == total, seen, what="every record")
            # What the survivors read of the victim's partitions starts at its last commit: the one it
            # logged, or one whose answer it got but had no time to log before the kill.
            for p in victim_parts:
                survivors = [
                    int(x["o"])  # type: ignore[call-overload]
                    for o in outs[1:]
                    for x in _lines(o)
                    if x.get("p") == p and float(x["t"]) > killed_wall  # type: ignore[arg-type]
                ]
                handled = [int(x["o"]) for x in victim_lines if x.get("p") == p]  # type: ignore[call-overload]
                assert survivors, f"partition {p} never moved"
                assert commits.get(p, 0) <= min(survivors) <= max(handled, default=-1) + 1
                moved_after = min(
                    float(x["t"])  # type: ignore[arg-type]
                    for o in outs[1:]
                    for x in _lines(o)
                    if x.get("p") == p and float(x["t"]) > killed_wall  # type: ignore[arg-type]
                )
                # within the session timeout (3 s), plus a heartbeat's or a poll's delay
                assert moved_after - killed_wall < 3.0 + 2.0, (
                    f"partition {p} moved after {moved_after - killed_wall:.1f} s"
                )
            for m in members[1:]:
                m.send_signal(signal.SIGTERM)
                waiting.wait_exit(m, what="a member to leave", progress=lambda: waiting.size_of(*outs))
            # The group's commits, as it holds them now: offsets only grow, so the largest of each partition.
            committed: dict[int, int] = {}
            for o in outs:
                for x in _lines(o):
                    for p, v in x.get("commit", {}).items():  # type: ignore[union-attr]
                        committed[int(p)] = max(committed.get(int(p), 0), int(v))
            server.send_signal(signal.SIGKILL)
            waiting.wait_exit(server, what="the killed server")
        finally:
            writing.clear()
            if writer.is_alive():
                writer.join()
            for m in members:
                if m.poll() is None:
                    m.kill()
                    m.wait()
    ends = filler.log.end_offsets(TOPIC)
    assert sorted(committed) == list(range(len(ends)))
    expected = {(p, o) for p, end in enumerate(ends) for o in range(committed[p], end)}
    with served(config, port, err_path=tmp_path / "serve2.err"):
        # "latest" would skip everything: what arrives is what the group committed before the kill.
        with Consumer(url, group="g", topics=[TOPIC], auto_offset_reset="latest", wait_ms=300) as c:
            got: list[tuple[int, int]] = []
            waiting.wait_progress(
                lambda: _read(c, got, len(expected)), lambda: len(got), what="the records after the commits"
            )
            time.sleep(0.5)  # a quiet while: nothing beyond them may come
            got.extend((r.partition, r.offset) for r in c.poll(200))
        assert committed and set(got) == expected and len(got) == len(expected)
    filler.close()


def test_stream_follows_the_log_and_resumes_across_a_server_restart(fresh_db: str, tmp_path: Path) -> None:
    """`Consumer.stream()`: records pushed as they are committed; the server stops and starts again
    mid-stream (nothing committed by the consumer): the stream reconnects with Last-Event-ID and
    hands out every record exactly once, in offset order per partition."""
    run_migrations(fresh_db)
    filler = Filler(tmp_path / "log")
    filler.topic(TOPIC, partitions=3)
    filler.write(TOPIC, [(f"k{i}", {"id": i}) for i in range(30)])
    port = free_port()
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", port=port)
    url = f"http://127.0.0.1:{port}"
    consumer = Consumer(url, group="s", topics=[TOPIC], auto_offset_reset="earliest", timeout_s=30)
    got: list[tuple[int, int, int]] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            for record in consumer.stream():
                got.append((record.partition, record.offset, record.value["id"]))
                if len(got) >= 90:
                    return
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            failed.append(exc)

    reader = threading.Thread(target=read)
    with served(config, port, err_path=tmp_path / "serve1.err"):
        reader.start()
        waiting.wait_progress(lambda: len(got) >= 30 or bool(failed), lambda: len(got), what="the first 30 records")
        filler.write(TOPIC, [(f"k{i}", {"id": i}) for i in range(30, 60)])
        waiting.wait_progress(
            lambda: len(got) >= 60 or bool(failed), lambda: len(got), what="records committed while streaming"
        )
    filler.write(TOPIC, [(f"k{i}", {"id": i}) for i in range(60, 90)])  # while no server runs
    with served(config, port, err_path=tmp_path / "serve2.err"):
        waiting.wait_threads([reader], what="the stream's last records", progress=lambda: len(got))
        assert not failed, failed
        assert sorted(i for _, _, i in got) == list(range(90))  # none lost, none handed out twice
        for p in range(3):
            offsets = [o for q, o, _ in got if q == p]
            assert offsets == list(range(len(offsets)))
        consumer.commit()
        consumer.close()
        with Consumer(url, group="s", topics=[TOPIC]) as again:
            assert again.poll(timeout_ms=500) == []
    filler.close()


def test_nack_redelivers_in_order_and_park_sets_records_aside(fresh_db: str, tmp_path: Path) -> None:
    """`nack` goes back to the record (the member's buffered records after it are not handed out
    before it), a second nack past `max_retries=1` parks it, `park` sets one aside with its reason,
    and a commit after them covers the partition."""
    run_migrations(fresh_db)
    filler = Filler(tmp_path / "log")
    filler.topic(TOPIC, partitions=1)
    filler.write(TOPIC, [(f"k{i}", {"id": i}) for i in range(10)])
    port = free_port()
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", port=port)
    url = f"http://127.0.0.1:{port}"
    seen: list[int] = []
    outcomes = []
    with served(config, port, err_path=tmp_path / "serve.err"):
        with Consumer(
            url,
            group="g",
            topics=[TOPIC],
            auto_offset_reset="earliest",
            max_retries=1,
            retry_backoff_ms=50,
            wait_ms=300,
        ) as c:
            for record in c:
                seen.append(record.offset)
                if record.offset == 3:
                    outcomes += c.nack([record], reason=f"try {seen.count(3)}")
                elif record.offset == 7:
                    outcomes += c.park([record], reason="bad order")
                if record.offset == 9:
                    break
            assert c.commit() == {(TOPIC, 0): 10}
        parked = httpx.get(f"{url}/groups/g/parked", timeout=10).json()
    filler.close()
    assert seen == [0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9]
    assert [(o.offset, o.action, o.attempts) for o in outcomes] == [
        (3, "retry", 1),
        (3, "parked", 2),
        (7, "parked", None),
    ]
    assert outcomes[0].retry_in_ms is not None and outcomes[0].retry_in_ms >= 0
    assert [(p["record"]["offset"], p["reason"], p["state"]) for p in parked] == [
        (3, "nacked 2 times (max_retries 1): try 2", "parked"),
        (7, "bad order", "parked"),
    ]
