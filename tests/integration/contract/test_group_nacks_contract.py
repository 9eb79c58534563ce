"""Members that say no, on every log backend, over HTTP and the CLI: a nacked record comes back after
its backoff (to whoever holds its partition after a rebalance), no commit passes it before; past
max_retries it is parked; a parked record's partition moves on; the parked records are listed and
replayed to the member holding their partition, and a commit after the replay settles them without
moving the committed offset back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests import waiting
from tests.backends import LogBackend, write_backend_config
from tests.integration.capture.helpers import cli
from tests.servers import free_port, serving
from tributary.eventstore.migrate import run_migrations

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
    r = httpx.get(
        f"{base}/groups/{GROUP}/members/{member}/records",
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


def test_nack_retry_park_list_and_replay(fresh_db: str, tmp_path: Path, backend: LogBackend) -> None:
    backend.prepare(TOPIC)
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
        missing = httpx.get(f"{base}/groups/nobody/parked", timeout=30)
        assert missing.status_code == 404 and missing.json()["code"] == "not_found", missing.text
