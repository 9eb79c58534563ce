"""Consumer groups on every log backend, as a user runs them: capture a table into the log, serve
it over HTTP, two members of a group share its partitions, commit, re-join after a restart, reset and
replay, a long poll woken by a commit, server-sent events; the HTTP sink delivers every record in
order and commits. Committed offsets are read back where the backend keeps them (Postgres for the
local log, Kafka's own group offsets on Kafka)."""

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

from tests import waiting
from tests.backends import LogBackend, write_backend_config
from tests.integration.capture.helpers import cli
from tests.integration.consumers.helpers import Receiver, receiving
from tests.servers import ROOT, free_port, serving
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.integration

TOPIC = "shop.public.items"
GROUP = "billing"


def _config(tmp_path: Path, dsn: str, backend: LogBackend, port: int) -> Path:
    path = write_backend_config(backend, tmp_path / "t.toml", dsn=dsn, log_root=tmp_path / "log")
    path.write_text(path.read_text() + f'\n[service]\ndsn = "{dsn}"\n\n[api]\nport = {port}\n')
    return path


def _offsets(backend: LogBackend, tmp_path: Path) -> set[tuple[int, int]]:
    """(partition, offset) of every committed record of TOPIC."""
    return {(r.partition, r.offset) for r in backend.records(tmp_path / "log", TOPIC)}


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


def test_groups_share_partitions_commit_and_replay(fresh_db: str, tmp_path: Path, backend: LogBackend) -> None:
    backend.prepare(TOPIC)
    log_root = tmp_path / "log"

    def committed(group: str = GROUP) -> dict[int, int]:
        return backend.committed(fresh_db, log_root, group, TOPIC)

    run_migrations(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 40) g")
    port = free_port()
    config = _config(tmp_path, fresh_db, backend, port)
    done = cli("capture", "--config", str(config), "--until-idle", "1")
    assert done.returncode == 0, done.stderr
    with psycopg.connect(
        fresh_db, autocommit=True
    ) as conn:  # a second transaction (on Kafka: a commit marker between records)
        conn.execute("UPDATE items SET note = note || '!' WHERE id % 3 = 0")
    done = cli("capture", "--config", str(config), "--until-idle", "1")
    assert done.returncode == 0, done.stderr
    expected = _offsets(backend, tmp_path)
    assert len(expected) > 40

    with serving(config, port, err_path=tmp_path / "serve1.err") as base:
        a = _join(base, "a")
        b = _join(base, "b")
        assert b["generation"] == a["generation"] + 1
        # a's generation is over: its commit is refused, whatever it names
        stale = _commit(base, "a", a["generation"], {0: 1})
        assert stale.status_code == 409 and stale.json()["code"] == "fenced", stale.text
        assert committed() == {}  # nothing was committed
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
            res = _commit(base, member, generation, part)
            assert res.status_code == 200, res.text
            half.update(part)
        assert committed() == half  # where the backend keeps group offsets

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
            res = _commit(base, member, generation, {p: o for p, o in ends.items() if p in held})
            assert res.status_code == 200, res.text
        for member in ("a", "b"):  # leave (a rebalance): a reset needs a group without members
            assert httpx.delete(f"{base}/groups/{GROUP}/members/{member}", timeout=30).status_code == 204

        described = cli("groups", "describe", GROUP, "--json", "--config", str(config))
        assert described.returncode == 0, described.stderr
        parts = {x["partition"]: x for x in json.loads(described.stdout)["partitions"]}
        assert {p: x["committed"] for p, x in parts.items()} == ends
        # lag = the end (last stable offset) − committed: on Kafka the one commit marker after each
        # partition's last record, none on the local log
        marker = 1 if backend.commit_takes_an_offset else 0
        assert {p: x["lag"] for p, x in parts.items()} == {p: x["end"] - ends[p] for p, x in parts.items()}
        assert all(x["end"] == ends[p] + marker for p, x in parts.items())

        listed = cli("groups", "list", "--json", "--config", str(config))
        assert listed.returncode == 0, listed.stderr
        assert {g["group"]: g["lag"] for g in json.loads(listed.stdout)} == {GROUP: 3 * marker}  # the markers, if any

        # a dry run (here to a time: the log's time index) shows new offsets and commits nothing
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
        assert committed() == ends

        # replay: reset to the earliest offsets (committed), and everything comes again
        reset = cli("groups", "reset", GROUP, "--to-earliest", "--config", str(config))
        assert reset.returncode == 0, reset.stderr
        assert committed() == {0: 0, 1: 0, 2: 0}
        a = _join(base, "a")
        replay = _pull_all(base, "a", a["generation"], len(expected))
        assert sorted((r["partition"], r["offset"]) for r in replay) == sorted(expected)

        # a long poll at the end wakes when capture commits a new change to the log
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
        now = _offsets(backend, tmp_path)
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


def test_http_sink_delivers_in_order_and_commits(fresh_db: str, tmp_path: Path, backend: LogBackend) -> None:
    backend.prepare(TOPIC)
    log_root = tmp_path / "log"

    def committed() -> dict[int, int]:
        return backend.committed(fresh_db, log_root, "sink-hook", TOPIC)

    run_migrations(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 25) g")
    config = _config(tmp_path, fresh_db, backend, free_port())
    done = cli("capture", "--config", str(config), "--until-idle", "1")
    assert done.returncode == 0, done.stderr
    expected = [(r.partition, r.offset) for r in backend.records(log_root, TOPIC)]
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
        last = {p: o + 1 for p, o in sorted(expected)}  # each partition's offset after its last record
        try:

            def delivered() -> bool:
                assert proc.poll() is None, err.read_text()
                return len(receiver.records()) >= len(expected) and committed() == last

            waiting.wait_progress(
                delivered,
                lambda: (receiver.requests, str(committed()), waiting.size_of(err)),
                what="every record delivered and committed",
                poll=0.2,
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            assert waiting.wait_exit(proc, what="the sink to stop", progress=lambda: waiting.size_of(err)) == 0, (
                err.read_text()
            )
    got = receiver.records()
    assert sorted((r["partition"], r["offset"]) for r in got) == sorted(expected)
    for p in range(3):
        offsets = [r["offset"] for r in got if r["partition"] == p]
        assert offsets == sorted(offsets)
