"""Consumer groups on the Kafka backend, as a user runs them: capture a table into Kafka, serve it
over HTTP, two members of a group share its partitions; committed offsets are Kafka's own."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from tests import waiting
from tests.integration.capture.helpers import cli
from tests.integration.consumers.helpers import Receiver, receiving
from tests.integration.kafka.helpers import read_committed, write_kafka_config
from tests.kafka_fixtures import KafkaCluster
from tests.servers import ROOT, free_port, serving
from tributary.consumers import GroupCoordinator
from tributary.eventstore.migrate import run_migrations
from tributary.log.kafka.clients import with_logger
from tributary.log.kafka.options import KafkaOptions
from tributary.log.local import LogError

pytestmark = pytest.mark.integration

TOPIC = "shop.public.items"
GROUP = "billing"


def _config(tmp_path: Path, dsn: str, kafka: KafkaCluster, port: int) -> Path:
    path = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn=dsn,
        log_root=tmp_path / "kstatus",
        bootstraps=kafka.bootstraps,
        create_topics=kafka.creates_topics,
    )
    path.write_text(path.read_text() + f'\n[service]\ndsn = "{dsn}"\n\n[api]\nport = {port}\n')
    return path


def _join(base: str, member: str) -> dict[str, Any]:
    r = httpx.post(
        f"{base}/groups/{GROUP}/members",
        json={"topics": [TOPIC], "member_id": member, "auto_offset_reset": "earliest", "session_timeout_ms": 60_000},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _pull_all(base: str, member: str, generation: int, want: int) -> list[dict[str, Any]]:
    """Pull (small batches) until `want` records arrived, then once more: nothing else may come."""
    got: list[dict[str, Any]] = []

    def pulled() -> bool:
        r = httpx.get(
            f"{base}/groups/{GROUP}/members/{member}/records",
            params={"generation": generation, "max_records": 7, "wait_ms": 300},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        batch = r.json()["records"]
        got.extend(batch)
        return len(got) >= want and not batch

    waiting.wait_progress(pulled, lambda: len(got), what=f"{want} records for {member}")
    return got


def _commit(base: str, member: str, generation: int, offsets: dict[int, int]) -> httpx.Response:
    return httpx.post(
        f"{base}/groups/{GROUP}/members/{member}/commit",
        json={
            "generation": generation,
            "offsets": [{"topic": TOPIC, "partition": p, "offset": o} for p, o in offsets.items()],
        },
        timeout=30,
    )


def _kafka_committed(bootstraps: str, group: str = GROUP) -> dict[int, int]:
    """What any Kafka client sees as the group's committed offsets."""
    consumer = Consumer(with_logger({"bootstrap.servers": bootstraps, "group.id": group, "enable.auto.commit": False}))
    try:
        got = consumer.committed([TopicPartition(TOPIC, p) for p in range(3)], timeout=30)
        return {tp.partition: tp.offset for tp in got if tp.offset >= 0}
    finally:
        consumer.close()


def test_groups_share_partitions_and_commit_to_kafka(fresh_db: str, tmp_path: Path, kafka: KafkaCluster) -> None:
    kafka.prepare(TOPIC)
    run_migrations(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 40) g")
    port = free_port()
    config = _config(tmp_path, fresh_db, kafka, port)
    done = cli("capture", "--config", str(config), "--until-idle", "1")
    assert done.returncode == 0, done.stderr
    with psycopg.connect(fresh_db, autocommit=True) as conn:  # a second transaction: markers between records
        conn.execute("UPDATE items SET note = note || '!' WHERE id % 3 = 0")
    done = cli("capture", "--config", str(config), "--until-idle", "1")
    assert done.returncode == 0, done.stderr
    expected = {(p, o) for _, p, o, *_ in read_committed(kafka.bootstraps, [TOPIC])}
    assert len(expected) > 40

    with serving(config, port, err_path=tmp_path / "serve1.err") as base:
        a = _join(base, "a")
        b = _join(base, "b")
        assert b["generation"] == a["generation"] + 1
        # a's generation is over: its commit is refused, whatever it names
        stale = _commit(base, "a", a["generation"], {0: 1})
        assert stale.status_code == 409 and stale.json()["code"] == "fenced", stale.text
        assert _kafka_committed(kafka.bootstraps) == {}  # nothing reached Kafka
        beat = httpx.post(
            f"{base}/groups/{GROUP}/members/a/heartbeat", json={"generation": a["generation"]}, timeout=30
        ).json()
        assert beat["rebalance"] and beat["generation"] == b["generation"]
        mine = {"a": {x["partition"] for x in beat["assignments"]}, "b": {x["partition"] for x in b["assignments"]}}
        assert mine["a"].isdisjoint(mine["b"]) and mine["a"] | mine["b"] == {0, 1, 2}

        generation = b["generation"]
        seen: dict[str, list[dict[str, Any]]] = {}
        for member in ("a", "b"):
            want = len([1 for p, _ in expected if p in mine[member]])
            seen[member] = _pull_all(base, member, generation, want)
        delivered = [(r["partition"], r["offset"]) for m in ("a", "b") for r in seen[m]]
        assert sorted(delivered) == sorted(expected)  # every record, exactly once
        for member, records in seen.items():
            assert {r["partition"] for r in records} <= mine[member]
            for p in mine[member]:
                offsets = [r["offset"] for r in records if r["partition"] == p]
                assert offsets == sorted(offsets)  # in offset order per partition

        # commit half of each partition: the offset after its middle record
        half: dict[int, int] = {}
        for member, records in seen.items():
            by_partition: dict[int, list[int]] = {}
            for r in records:
                by_partition.setdefault(r["partition"], []).append(r["offset"])
            part = {p: offs[len(offs) // 2] + 1 for p, offs in by_partition.items()}
            r = _commit(base, member, generation, part)
            assert r.status_code == 200, r.text
            half.update(part)
        assert _kafka_committed(kafka.bootstraps) == half  # Kafka's own group offsets

    # a restart of the server: both members re-join and go on from the committed offsets
    rest = {(p, o) for p, o in expected if o >= half[p]}
    with serving(config, port, err_path=tmp_path / "serve2.err") as base:
        again = {m: _join(base, m) for m in ("a", "b")}
        generation = again["b"]["generation"]
        assert again["a"]["generation"] == generation  # re-joining members: no rebalance
        got = []
        for member in ("a", "b"):
            want = len([1 for p, _ in rest if any(x["partition"] == p for x in again[member]["assignments"])])
            got += _pull_all(base, member, generation, want)
        assert sorted((r["partition"], r["offset"]) for r in got) == sorted(rest)
        ends = {p: max(o for q, o in expected if q == p) + 1 for p in range(3)}
        for member in ("a", "b"):
            held = {x["partition"] for x in again[member]["assignments"]}
            r = _commit(base, member, generation, {p: o for p, o in ends.items() if p in held})
            assert r.status_code == 200, r.text
        for member in ("a", "b"):  # leave (a rebalance): a reset needs a group without members
            assert httpx.delete(f"{base}/groups/{GROUP}/members/{member}", timeout=30).status_code == 204

        described = cli("groups", "describe", GROUP, "--json", "--config", str(config))
        assert described.returncode == 0, described.stderr
        parts = {x["partition"]: x for x in json.loads(described.stdout)["partitions"]}
        assert {p: x["committed"] for p, x in parts.items()} == ends
        # lag = last stable offset − committed: here the one commit marker after each partition's last record
        assert {p: x["lag"] for p, x in parts.items()} == {p: x["end"] - ends[p] for p, x in parts.items()}
        assert all(x["end"] == ends[p] + 1 for p, x in parts.items())

        listed = cli("groups", "list", "--json", "--config", str(config))
        assert listed.returncode == 0, listed.stderr
        assert {g["group"]: g["lag"] for g in json.loads(listed.stdout)} == {GROUP: 3}  # the three markers

        # a dry run (here to a time: Kafka's time index) shows new offsets and writes nothing to Kafka
        dry = cli(
            "groups",
            "reset",
            GROUP,
            "--to-datetime",
            "2020-01-01T00:00:00Z",
            "--dry-run",
            "--json",
            "--config",
            str(config),
        )
        assert dry.returncode == 0, dry.stderr
        planned = json.loads(dry.stdout)["offsets"]
        assert {o["partition"] for o in planned} == {0, 1, 2}
        assert all(0 <= o["offset"] <= parts[o["partition"]]["end"] for o in planned)
        assert _kafka_committed(kafka.bootstraps) == ends

        # replay: reset to the earliest offsets (written to Kafka), and everything comes again
        reset = cli("groups", "reset", GROUP, "--to-earliest", "--config", str(config))
        assert reset.returncode == 0, reset.stderr
        assert _kafka_committed(kafka.bootstraps) == {0: 0, 1: 0, 2: 0}
        a = _join(base, "a")
        replay = _pull_all(base, "a", a["generation"], len(expected))
        assert sorted((r["partition"], r["offset"]) for r in replay) == sorted(expected)

        # a long poll at the end wakes when capture commits a new change to Kafka
        woke: list[Any] = []

        def wait() -> None:
            started = time.monotonic()
            r = httpx.get(
                f"{base}/groups/{GROUP}/members/a/records",
                params={"generation": a["generation"], "wait_ms": 60_000},
                timeout=90,
            )
            woke.append((r.json()["records"], time.monotonic() - started))

        waiter = threading.Thread(target=wait)
        waiter.start()
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("UPDATE items SET note = 'late' WHERE id = 1")
        done = cli("capture", "--config", str(config), "--until-idle", "1")
        assert done.returncode == 0, done.stderr
        waiter.join()  # (the long poll ends by itself, at the latest after its wait_ms)
        [(late, waited)] = woke
        now = {(p, o) for _, p, o, *_ in read_committed(kafka.bootstraps, [TOPIC])}
        assert late and {(r["partition"], r["offset"]) for r in late} <= now - expected
        assert waited < 55, waited  # woken by the commit, not by the 60 s timeout

        # server-sent events: another group streams every record from the start
        audit = httpx.post(
            f"{base}/groups/audit/members", json={"topics": [TOPIC], "auto_offset_reset": "earliest"}, timeout=30
        ).json()
        streamed = []
        url = f"{base}/groups/audit/members/{audit['member_id']}/stream"
        with httpx.stream("GET", url, params={"generation": audit["generation"]}, timeout=60) as events:
            event = ""
            for line in events.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "record":
                    streamed.append(json.loads(line[5:]))
                    if len(streamed) == len(now):
                        break
        assert sorted((r["partition"], r["offset"]) for r in streamed) == sorted(now)
        assert {"id": 1, "note": "late"} in [(r["value"] or {}).get("after") for r in streamed]


def test_http_sink_delivers_from_kafka_and_commits_there(fresh_db: str, tmp_path: Path, kafka: KafkaCluster) -> None:
    kafka.prepare(TOPIC)
    run_migrations(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 25) g")
    config = _config(tmp_path, fresh_db, kafka, free_port())
    done = cli("capture", "--config", str(config), "--until-idle", "1")
    assert done.returncode == 0, done.stderr
    expected = read_committed(kafka.bootstraps, [TOPIC])
    with receiving(Receiver()) as receiver:
        sink = f'\n[[sinks]]\ntype = "http"\nname = "hook"\nurl = "{receiver.url}"\ntopics = ["{TOPIC}"]\n'
        sink += "max_batch_records = 9\nlinger_ms = 10\n"
        config.write_text(config.read_text() + sink)
        err = tmp_path / "sink.err"
        with err.open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", "from tributary.api.cli.main import main; main()", "sinks", "run"]
                + ["--config", str(config)],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )
        last = {p: o + 1 for _, p, o, *_ in sorted(expected)}  # each partition's offset after its last record
        try:

            def delivered() -> bool:
                assert proc.poll() is None, err.read_text()
                return (
                    len(receiver.records()) >= len(expected) and _kafka_committed(kafka.bootstraps, "sink-hook") == last
                )

            waiting.wait_progress(
                delivered,
                lambda: (receiver.requests, str(_kafka_committed(kafka.bootstraps, "sink-hook")), waiting.size_of(err)),
                what="every record delivered and committed to Kafka",
                poll=0.2,
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            assert waiting.wait_exit(proc, what="the sink to stop", progress=lambda: waiting.size_of(err)) == 0, (
                err.read_text()
            )
    got = receiver.records()
    assert sorted((r["partition"], r["offset"]) for r in got) == sorted((p, o) for _, p, o, *_ in expected)
    for p in range(3):
        offsets = [r["offset"] for r in got if r["partition"] == p]
        assert offsets == sorted(offsets)


def test_a_kafka_member_of_the_same_group_id_blocks_commits_until_it_leaves(
    fresh_db: str, tmp_path: Path, kafka: KafkaCluster
) -> None:
    topic = "plain.topic"
    kafka.create(topic, 2)  # AdminClient where clients may create topics, kept alive until the topic is made
    run_migrations(fresh_db)
    options = KafkaOptions(bootstrap_servers=kafka.bootstraps, client={"log_level": "3"})
    with GroupCoordinator(fresh_db, tmp_path / "unused", kafka=options) as coordinator:
        me = coordinator.join("shared", [topic], member_id="m", session_timeout_ms=120_000)
        assert sorted(me.assignments) == [(topic, 0), (topic, 1)]
        member = Consumer(
            with_logger(
                {
                    "bootstrap.servers": kafka.bootstraps,
                    "group.id": "shared",
                    "session.timeout.ms": 6000,
                    "log_level": "3",
                }
            )
        )
        member.subscribe([topic])

        def assigned() -> bool:  # a live member of Kafka's own group "shared"
            member.poll(0.2)
            return bool(member.assignment())

        waiting.wait_progress(assigned, lambda: None, what="Kafka to assign the plain consumer its partitions")
        with pytest.raises(LogError, match="group.id 'shared'"):
            coordinator.commit("shared", "m", me.generation, [(topic, 0, 0)])
        member.close()  # leaves Kafka's group: once it is empty, tributary's commits go through
        if kafka.kind == "mock":
            return  # the mock cluster keeps refusing commits without a member once its group had one

        def committed() -> bool:  # Kafka refuses while it still counts the member that left
            try:
                coordinator.commit("shared", "m", me.generation, [(topic, 0, 0), (topic, 1, 0)])
            except LogError:
                return False
            return True

        waiting.wait_progress(committed, lambda: None, what="Kafka to take the commit after its member left", poll=0.5)
        assert coordinator.offsets.committed("shared", [(topic, 0), (topic, 1)]) == {(topic, 0): 0, (topic, 1): 0}
