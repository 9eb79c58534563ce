"""The HTTP sink end to end: `tributary sinks run` over a real log and Postgres, and a real receiver on loopback that fails some requests (503s, a refused record).

Every record reaches the receiver or the dead letters, in offset order per partition (so per key),
nothing twice within a run; a restarted sink resumes after its last commit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests import waiting
from tests.integration.capture.helpers import cli
from tests.integration.consumers.helpers import Filler, Receiver, receiving, write_config
from tests.servers import ROOT, free_port, serving
from tributary.consumers import GroupCoordinator
from tributary.eventstore.migrate import run_migrations
from tributary.log.local import Log

pytestmark = pytest.mark.integration

TOPIC = "shop.public.orders"


def _stopped(proc: subprocess.Popen[bytes], err: Path) -> int:
    """The sink's exit status once it has stopped (after a signal), waiting while its log moves."""
    return waiting.wait_exit(proc, what="the sink to stop", progress=lambda: waiting.size_of(err))


def _sinks_run(config: Path, err: Path) -> subprocess.Popen[bytes]:
    with err.open("ab") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from tributary.api.cli.main import main; main()",
                "sinks",
                "run",
                "--config",
                str(config),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )


def _plan(n: int, records: list[Any]) -> int:
    if any(r["value"].get("poison") for r in records):
        return 400  # the receiver refuses this content
    return 503 if n % 4 == 0 else 200  # and is down for every fourth request


def test_sink_delivers_in_order_retries_and_dead_letters(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    root = tmp_path / "log"
    filler = Filler(root)
    filler.topic(TOPIC, partitions=3)
    keys = [f"k{i}" for i in range(20)]
    first = [(k, {"key": k, "n": n, "poison": (k, n) == ("k7", 3)}) for n in range(10) for k in keys]
    filler.write(TOPIC, first)
    port = free_port()
    with receiving(Receiver(plan=_plan)) as receiver:
        sink = f"""
[[sinks]]
type = "http"
name = "hook"
url = "{receiver.url}"
topics = ["{TOPIC}"]
max_batch_records = 17
linger_ms = 20
max_attempts = 6
initial_backoff_ms = 10
max_backoff_ms = 50
"""
        config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=root, port=port, extra=sink)
        err = tmp_path / "sink.err"
        proc = _sinks_run(config, err)
        try:
            waiting.wait_progress(
                lambda: len(receiver.records()) == len(first) - 1,
                lambda: (receiver.requests, waiting.size_of(err)),
                what="the first records",
            )
            dead = cli("sinks", "dead-letters", "hook", "--config", str(config))
            assert dead.returncode == 0, dead.stderr
            letters = [json.loads(line) for line in dead.stdout.splitlines()]
            assert [(d["key"], d["value"]) for d in letters] == [('"k7"', {"key": "k7", "n": 3, "poison": True})]
            assert letters[0]["attempts"] == 1 and "HTTP 400" in letters[0]["error"]
            waiting.wait_progress(
                lambda: _lag(fresh_db, root) == 0,
                lambda: (_lag(fresh_db, root), receiver.requests),
                what="the sink's last commit",
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            assert _stopped(proc, err) == 0, err.read_text()
        got = receiver.records()
        offsets: dict[int, list[int]] = {}
        for r in got:
            offsets.setdefault(r["partition"], []).append(r["offset"])
        assert all(o == sorted(set(o)) for o in offsets.values()), "out of order or twice"
        by_key: dict[str, list[int]] = {}
        for r in got:
            by_key.setdefault(r["value"]["key"], []).append(r["value"]["n"])
        assert by_key == {k: [n for n in range(10) if (k, n) != ("k7", 3)] for k in keys}
        assert receiver.refused and {s for _, s in receiver.refused} == {400, 503}
        status = _status(config)
        assert status["delivered"] == len(first) - 1 and status["dead_letters"] == 1
        assert status["failed_attempts"] >= sum(1 for _, s in receiver.refused if s == 503)
        with serving(config, port, err_path=tmp_path / "serve.err") as url:  # the same figures in /metrics

            def metrics() -> str:
                return httpx.get(f"{url}/metrics", timeout=10).text

            lag_line = f'tributary_consumer_lag_records{{group="sink-hook",partition="0",topic="{TOPIC}"}} 0.0'

            def shown() -> int:
                text = metrics()
                return sum(m in text for m in (lag_line, "tributary_sink_"))

            waiting.wait_progress(lambda: shown() == 2, shown, what="the sink and its group in /metrics")
            text = metrics()
            assert 'tributary_sink_dead_letters_total{sink="hook"} 1.0' in text
            assert f'tributary_sink_delivered_records_total{{sink="hook"}} {len(first) - 1}.0' in text
            assert 'tributary_sink_state{sink="hook",state="stopped"} 1.0' in text

        # A restart resumes after the last commit: only the new records arrive.
        second = [(k, {"key": k, "n": 10 + n, "poison": False}) for n in range(3) for k in keys]
        filler.write(TOPIC, second)
        before = len(got)
        proc = _sinks_run(config, err)
        try:
            waiting.wait_progress(
                lambda: len(receiver.records()) >= before + len(second),
                lambda: (receiver.requests, waiting.size_of(err)),
                what="the new records",
            )
            time.sleep(0.5)  # a quiet while: nothing beyond them may come
        finally:
            proc.send_signal(signal.SIGTERM)
            assert _stopped(proc, err) == 0, err.read_text()
        new = receiver.records()[before:]
        assert sorted((r["value"]["key"], r["value"]["n"]) for r in new) == sorted((k, v["n"]) for k, v in second)
    filler.close()


def _lag(dsn: str, root: Path) -> int | None:
    with GroupCoordinator(dsn, root, max_connections=1) as coordinator:
        described = coordinator.describe("sink-hook")
    return (
        None
        if described is None
        else sum(p["lag"] if p["lag"] is not None else 1 << 30 for p in described["partitions"])
    )


def _members(dsn: str, root: Path, *, alive: bool = False) -> list[list[Any]]:
    """The assignments of each member (with `alive`: each one still in its session) of the sink's
    group (none before its first join)."""
    with GroupCoordinator(dsn, root, max_connections=1) as coordinator:
        described = coordinator.describe("sink-hook")
    members = [] if described is None else described["members"]
    return [m["assignments"] for m in members if m["alive"] or not alive]


def _status(config: Path) -> dict[str, Any]:
    out = cli("sinks", "status", "--json", "--config", str(config))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[0])  # type: ignore[no-any-return]


def test_kill_9_the_sink_redelivers_only_after_its_last_commit(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    root = tmp_path / "log"
    filler = Filler(root)
    filler.topic(TOPIC, partitions=3)
    items = [(f"k{i % 50}", {"key": f"k{i % 50}", "n": i, "poison": False}) for i in range(3000)]
    filler.write(TOPIC, items)

    def slow(n: int, records: list[Any]) -> int:
        time.sleep(0.03)  # a receiver that takes its time: the kill lands mid-stream
        return 200

    with receiving(Receiver(plan=slow)) as receiver:
        sink = f'[[sinks]]\ntype = "http"\nname = "hook"\nurl = "{receiver.url}"\ntopics = ["{TOPIC}"]\nmax_batch_records = 40\nlinger_ms = 5\n'
        session = "[consumers]\nsession_timeout_ms = 3000\n"
        config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=root, port=free_port(), extra=session + sink)
        err = tmp_path / "sink.err"
        proc = _sinks_run(config, err)
        try:
            waiting.wait_progress(
                lambda: len(receiver.records()) >= 600, lambda: receiver.requests, what="some records"
            )
        finally:
            proc.send_signal(signal.SIGKILL)
            _stopped(proc, err)
        with GroupCoordinator(fresh_db, root, max_connections=1) as coordinator:
            described = coordinator.describe("sink-hook")
        assert described is not None
        committed = {p["partition"]: p["committed"] or 0 for p in described["partitions"]}
        before = len(receiver.records())
        assert before < len(items), "the kill came too late to prove anything"
        # The restart joins once the killed member's session is over: it takes every partition at its
        # commit at once, with no rebalance later in its run (which would fence its commit in hand and
        # deliver that batch again, as at-least-once allows).
        waiting.wait_progress(
            lambda: not _members(fresh_db, root, alive=True), lambda: None, what="the killed member's session to end"
        )
        proc = _sinks_run(config, err)
        try:
            waiting.wait_progress(
                lambda: {(r["partition"], r["offset"]) for r in receiver.records()} >= _all(root),
                lambda: receiver.requests,
                what="every record",
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            assert _stopped(proc, err) == 0, err.read_text()
        got = receiver.records()
        first_run, second_run = got[:before], got[before:]
        for p in committed:
            again = [r["offset"] for r in second_run if r["partition"] == p]
            # the restart starts at the last commit, and goes on in order without a gap
            assert again == list(range(committed[p], committed[p] + len(again)))
            before_kill = [r["offset"] for r in first_run if r["partition"] == p]
            assert before_kill == list(range(len(before_kill)))  # in order, none twice, none skipped
            assert committed[p] <= len(before_kill)  # a commit only follows a delivery
    filler.close()


def _all(root: Path) -> set[tuple[int, int]]:
    with Log.open(root) as log:
        return {(p, o) for p, end in enumerate(log.end_offsets(TOPIC)) for o in range(end)}


def test_a_sink_started_before_its_topic_exists_delivers_once_it_appears(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    root = tmp_path / "log"
    filler = Filler(root)  # an empty log: capture has not created the topic yet
    with receiving(Receiver()) as receiver:
        sink = f'[[sinks]]\ntype = "http"\nname = "hook"\nurl = "{receiver.url}"\ntopics = ["{TOPIC}"]\n'
        config = write_config(
            tmp_path / "t.toml",
            dsn=fresh_db,
            log_root=root,
            port=free_port(),
            extra="[consumers]\nsession_timeout_ms = 1500\n" + sink,
        )
        err = tmp_path / "sink.err"
        proc = _sinks_run(config, err)
        try:
            waiting.wait_progress(  # joined, with nothing to read
                lambda: _members(fresh_db, root) == [[]],
                lambda: (waiting.tree_cpu_s(proc.pid), waiting.size_of(err)),
                what="the sink to join its group",
            )
            filler.topic(TOPIC, partitions=2)
            filler.write(TOPIC, [(f"k{i}", {"key": f"k{i}", "n": i}) for i in range(10)])
            waiting.wait_progress(
                lambda: len(receiver.records()) == 10,
                lambda: (receiver.requests, str(_members(fresh_db, root))),
                what="the records of the new topic",
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            assert _stopped(proc, err) == 0, err.read_text()
    filler.close()
