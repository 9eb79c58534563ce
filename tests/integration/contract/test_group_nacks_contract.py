"""Members that say no, on every log backend, over HTTP and the CLI: a nacked record comes back after
its backoff (to whoever holds its partition after a rebalance), no commit passes it before; past
max_retries it is parked; a parked record's partition moves on; the parked records are listed and
replayed to the member holding their partition, and a commit after the replay settles them without
moving the committed offset back. Parked records are in the group's parked topic with where they came
from and why, readable by any group; a park whose database commit failed after its topic write is
listed once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests import waiting
from tests.backends import LogBackend, write_backend_config, writer
from tests.integration.capture.helpers import cli
from tests.servers import free_port, serving
from tributary.consumers.coordinator import GroupCoordinator
from tributary.consumers.parked_topic import parked_topic
from tributary.eventstore.migrate import run_migrations
from tributary.log import Record, TopicConfig

pytestmark = pytest.mark.integration

TOPIC = "shop.public.items"
GROUP = "ledger"


def _join(base: str, member: str) -> dict[str, Any]:
    r = httpx.post(
        f"{base}/groups/{GROUP}/members",
        json={
            "topics": [TOPIC],
            "member_id": member,
            "auto_offset_reset": "earliest",
            "session_timeout_ms": 60_000,
            "max_retries": 1,
            "retry_backoff_ms": 300,
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def _pull(base: str, member: str, generation: int) -> list[dict[str, Any]]:
    return _pull_group(base, GROUP, member, generation)


def _pull_group(base: str, group: str, member: str, generation: int) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{base}/groups/{group}/members/{member}/records",
        params={"generation": generation, "max_records": 1000, "wait_ms": 200},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()["records"]  # type: ignore[no-any-return]


def _say(base: str, member: str, generation: int, what: str, rec: dict[str, Any], reason: str) -> dict[str, Any]:
    ref = {"topic": rec["topic"], "partition": rec["partition"], "offset": rec["offset"]}
    r = httpx.post(
        f"{base}/groups/{GROUP}/members/{member}/{what}",
        json={"generation": generation, "records": [ref], "reason": reason},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()["records"][0]  # type: ignore[no-any-return]


def _commit(base: str, member: str, generation: int, offsets: dict[int, int]) -> list[dict[str, Any]]:
    r = httpx.post(
        f"{base}/groups/{GROUP}/members/{member}/commit",
        json={
            "generation": generation,
            "offsets": [{"topic": TOPIC, "partition": p, "offset": o} for p, o in offsets.items()],
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r.json()["offsets"]  # type: ignore[no-any-return]


def _ends(records: list[dict[str, Any]]) -> dict[int, int]:
    ends: dict[int, int] = {}
    for r in records:
        ends[r["partition"]] = max(ends.get(r["partition"], 0), r["offset"] + 1)
    return ends


def _parked_in_topic(backend: LogBackend, log_root: Path, group: str) -> dict[tuple[int, int], dict[str, str]]:
    """The `tributary.parked.*` headers of the group's parked topic's records, by original (partition, offset)."""
    out = {}
    for r in backend.records(log_root, parked_topic(group)):
        h = json.loads(r.headers or b"{}")
        out[(int(h["tributary.parked.partition"]), int(h["tributary.parked.offset"]))] = h
    return out


def test_nack_retry_park_list_and_replay(fresh_db: str, tmp_path: Path, backend: LogBackend) -> None:
    backend.prepare(TOPIC, parked_topic(GROUP))
    log_root = tmp_path / "log"
    run_migrations(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 30) g")
    port = free_port()
    config = write_backend_config(backend, tmp_path / "t.toml", dsn=fresh_db, log_root=log_root)
    config.write_text(config.read_text() + f'\n[service]\ndsn = "{fresh_db}"\n\n[api]\nport = {port}\n')
    done = cli("capture", "--config", str(config), "--until-idle", "1")
    assert done.returncode == 0, done.stderr
    every = {(r.partition, r.offset) for r in backend.records(log_root, TOPIC)}

    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        a = _join(base, "a")
        first: list[dict[str, Any]] = []
        waiting.wait_progress(
            lambda: bool(first.extend(_pull(base, "a", a["generation"]))) or len(first) >= len(every),
            lambda: len(first),
            what="every record for a",
        )
        ends = _ends(first)
        by_partition = sorted({r["partition"] for r in first})
        p_nack, p_park = by_partition[0], by_partition[-1]
        in_nack = [r for r in first if r["partition"] == p_nack]
        nacked = in_nack[len(in_nack) // 2]  # a record with records after it
        poison = [r for r in first if r["partition"] == p_park][0]

        retry = _say(base, "a", a["generation"], "nack", nacked, "downstream timed out")
        assert (retry["action"], retry["attempts"]) == ("retry", 1)
        parked = _say(base, "a", a["generation"], "park", poison, "cannot parse")
        assert parked["action"] == "parked"
        # a commit of everything handed out stops at the nacked record: it was not processed
        committed = {o["partition"]: o["offset"] for o in _commit(base, "a", a["generation"], ends)}
        assert committed == {**ends, p_nack: nacked["offset"]}
        assert backend.committed(fresh_db, log_root, GROUP, TOPIC) == committed

        # a leaves before the retry; b, who holds every partition now, gets the nacked record after
        # its backoff, then what followed it on its partition, in order (the parked partition moved on)
        assert httpx.delete(f"{base}/groups/{GROUP}/members/a", timeout=30).status_code == 204
        b = _join(base, "b")
        again: list[dict[str, Any]] = []
        waiting.wait_progress(
            lambda: bool(again.extend(_pull(base, "b", b["generation"]))) or len(again) > 0,
            lambda: len(again),
            what="the nacked record again",
        )
        assert [(r["partition"], r["offset"]) for r in again] == [
            (p_nack, r["offset"]) for r in in_nack[len(in_nack) // 2 :]
        ]
        assert again[0]["value"] == nacked["value"]
        # nacked past max_retries (1): parked
        second = _say(base, "b", b["generation"], "nack", nacked, "still timing out")
        assert (second["action"], second["attempts"]) == ("parked", 2)
        assert {o["partition"]: o["offset"] for o in _commit(base, "b", b["generation"], ends)} == ends
        assert _pull(base, "b", b["generation"]) == []  # the partition moved on

        listed = httpx.get(f"{base}/groups/{GROUP}/parked", timeout=30).json()
        got = {(x["record"]["partition"], x["record"]["offset"]): x for x in listed}
        assert set(got) == {(p_park, poison["offset"]), (p_nack, nacked["offset"])}
        assert got[(p_park, poison["offset"])]["reason"] == "cannot parse"
        assert got[(p_park, poison["offset"])]["record"] == poison  # the original record, whole
        assert got[(p_nack, nacked["offset"])]["attempts"] == 2
        assert "still timing out" in got[(p_nack, nacked["offset"])]["reason"]
        assert {x["state"] for x in listed} == {"parked"}
        # the parked topic holds each park: the original key and value, headers saying where from and why
        in_topic = _parked_in_topic(backend, log_root, GROUP)
        assert set(in_topic) == set(got)
        for at, h in in_topic.items():
            assert h["tributary.parked.topic"] == TOPIC
            assert h["tributary.parked.reason"] == got[at]["reason"]
            assert int(h["tributary.parked.attempts"]) == got[at]["attempts"]
            assert h["tributary.parked.parked_by"] == got[at]["parked_by"]
            assert int(h["tributary.parked.timestamp"]) == got[at]["record"]["timestamp_ms"]
        originals = {(r.partition, r.offset): r for r in backend.records(log_root, TOPIC)}
        for r in backend.records(log_root, parked_topic(GROUP)):
            h = json.loads(r.headers or b"{}")
            original = originals[(int(h["tributary.parked.partition"]), int(h["tributary.parked.offset"]))]
            assert (r.key, r.value) == (original.key, original.value)

        shown = cli("groups", "parked", GROUP, "--json", "--config", str(config))
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout) == listed
        table = cli("groups", "parked", GROUP, "--config", str(config))
        assert table.returncode == 0 and "cannot parse" in table.stdout, table.stderr
        replayed = cli("groups", "replay-parked", GROUP, "--json", "--config", str(config))
        assert replayed.returncode == 0, replayed.stderr
        assert json.loads(replayed.stdout) == {"group": GROUP, "replaying": 2}

        # the replayed records reach the member holding their partitions, once
        back = _pull(base, "b", b["generation"])
        assert sorted((r["partition"], r["offset"]) for r in back) == sorted(got)
        assert _pull(base, "b", b["generation"]) == []
        # b's commit (the offset after a replayed record) settles them; the committed offset stays
        replay_commit = {r["partition"]: r["offset"] + 1 for r in back}
        assert {o["partition"]: o["offset"] for o in _commit(base, "b", b["generation"], replay_commit)} == {
            p: ends[p] for p in replay_commit
        }
        assert backend.committed(fresh_db, log_root, GROUP, TOPIC) == ends
        states = httpx.get(f"{base}/groups/{GROUP}/parked", params={"state": "replayed"}, timeout=30).json()
        assert len(states) == 2 and all(x["replays"] == 1 for x in states)
        nothing = httpx.post(f"{base}/groups/{GROUP}/parked/replay", json={}, timeout=30)
        assert nothing.status_code == 200 and nothing.json()["replaying"] == 0, nothing.text
        unfiltered = httpx.post(  # a server-side filter applies to event topics: others' records pass as they are
            f"{base}/groups/{GROUP}/members",
            json={"topics": [TOPIC], "member_id": "f", "filter": {"event_types": ["X"]}},
            timeout=30,
        )
        assert unfiltered.status_code == 200, unfiltered.text
        assert httpx.delete(f"{base}/groups/{GROUP}/members/f", timeout=30).status_code == 204
        stranger = httpx.post(  # a member's nack or park names its own partitions: else 409, whatever the offsets
            f"{base}/groups/{GROUP}/members/nobody/park",
            json={"generation": 1, "records": [{"topic": TOPIC, "partition": 0, "offset": 10**9}], "reason": "r"},
            timeout=30,
        )
        assert stranger.status_code == 409, stranger.text
        # any group reads the parked topic like any topic
        auditor = httpx.post(
            f"{base}/groups/auditor/members",
            json={"topics": [parked_topic(GROUP)], "member_id": "x", "auto_offset_reset": "earliest"},
            timeout=30,
        )
        assert auditor.status_code == 200, auditor.text
        audited: list[dict[str, Any]] = []
        waiting.wait_progress(
            lambda: (
                bool(audited.extend(_pull_group(base, "auditor", "x", auditor.json()["generation"])))
                or len(audited) >= 2
            ),
            lambda: len(audited),
            what="the parked topic's records for another group",
        )
        assert sorted(int(r["headers"]["tributary.parked.offset"]) for r in audited) == sorted(o for _, o in got)
        missing = httpx.get(f"{base}/groups/nobody/parked", timeout=30)
        assert missing.status_code == 404 and missing.json()["code"] == "not_found", missing.text


def test_a_park_whose_commit_failed_is_listed_once(fresh_db: str, tmp_path: Path, backend: LogBackend) -> None:
    topic, group = "crash.public.items", "crash:group"  # a group name that is no topic name
    backend.prepare(topic, parked_topic(group))
    run_migrations(fresh_db)
    log_root = tmp_path / "log"
    w = writer(backend, log_root, ["crash"], writer_id="crash")
    try:
        src = w.source("crash")
        src.create_topic(topic, TopicConfig(partitions=1))
        src.append(topic, 0, [(b'{"id":1}', b'{"n":1}', 1_700_000_000_000, b'{"trace":"t1"}')])
        w.commit()
    finally:
        w.close()
    kafka = backend.kafka_options("crash-groups")
    with GroupCoordinator(fresh_db, log_root, kafka=kafka, poll_interval_ms=0, auto_offset_reset="earliest") as c:
        m = c.join(group, [topic], member_id="m", session_timeout_ms=60_000)
        got: list[Record] = []
        waiting.wait_progress(
            lambda: bool(got.extend(c.fetch(group, "m", m.generation).records)) or len(got) >= 1,
            lambda: len(got),
            what="the record",
        )
        ref = [(topic, 0, got[0].offset)]
        # the database refuses the park at its commit: after the parked topic was written
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute(
                "CREATE FUNCTION refuse_park() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'injected: park refused at commit'; END $$"
            )
            conn.execute(
                "CREATE CONSTRAINT TRIGGER refuse_park AFTER INSERT ON consumers.parked "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_park()"
            )
        with pytest.raises(psycopg.Error, match="injected"):
            c.park(group, "m", m.generation, ref, reason="cannot parse")
        assert len(backend.records(log_root, parked_topic(group))) == 1  # written, not committed in the database
        assert c.parked(group) == []
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("DROP TRIGGER refuse_park ON consumers.parked")
        c.park(group, "m", m.generation, ref, reason="cannot parse")  # the member parks it again
        assert len(backend.records(log_root, parked_topic(group))) == 2
        listed = c.parked(group)
        assert len(listed) == 1
        assert listed[0]["record"] == got[0]
        assert (listed[0]["reason"], listed[0]["parked_by"], listed[0]["state"]) == ("cannot parse", "m", "parked")
        # replayed, then parked again: the topic has the new park, the listing shows only it
        assert c.replay_parked(group) == 1
        again: list[Record] = []
        waiting.wait_progress(
            lambda: bool(again.extend(c.fetch(group, "m", m.generation).records)) or len(again) >= 1,
            lambda: len(again),
            what="the replayed record",
        )
        assert again[0] == got[0]
        c.park(group, "m", m.generation, ref, reason="still cannot parse")
        assert len(backend.records(log_root, parked_topic(group))) == 3
        relisted = c.parked(group)
        assert [(x["reason"], x["attempts"], x["state"], x["replays"]) for x in relisted] == [
            ("still cannot parse", 1, "parked", 1)
        ]
        assert relisted[0]["parked_at"] > listed[0]["parked_at"]
