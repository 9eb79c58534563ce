"""Consumer groups through a real `tributary serve` on a real PostgreSQL and a real log: join, long-poll
pull, commit, fencing, server-sent events with Last-Event-ID, reset, describe, metrics, and committed
offsets surviving a kill -9 of the server."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.integration.projections.helpers import LogWriter
from tests.servers import free_port, served
from tests.waiting import size_of, wait_exit, wait_progress, wait_threads
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.e2e

TOPIC = "events.account"


class Setup:
    def __init__(self, dsn: str, tmp: Path) -> None:
        self.dsn, self.tmp = dsn, tmp
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.config = tmp / "t.toml"
        self.config.write_text(
            f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{tmp / "log"}"\n[api]\nport = {self.port}\nstatus_refresh_s = 0.2\n'
            '[consumers]\nauto_offset_reset = "earliest"\npoll_interval_ms = 10\nsweep_interval_ms = 200\n'
        )
        self.writer = LogWriter(tmp / "log")
        self.writer.topic(TOPIC, partitions=3)
        self.n = 0

    def write(self, n: int, at_ms: int = 1_700_000_000_000) -> None:
        for i in range(self.n, self.n + n):
            self.writer.append(TOPIC, f"acct-{i % 7}", i, "Deposited", at_ms + i, amount=i)
        self.writer.commit()
        self.n += n

    def serve(self) -> Any:
        return served(self.config, self.port, err_path=self.tmp / "serve.err")


@pytest.fixture
def setup(fresh_db: str, tmp_path: Path) -> Iterator[Setup]:
    run_migrations(fresh_db)
    s = Setup(fresh_db, tmp_path)
    yield s
    s.writer.close()


def join(c: httpx.Client, group: str, **body: Any) -> dict[str, Any]:
    got = c.post(f"/groups/{group}/members", json={"topics": [TOPIC], **body})
    assert got.status_code == 200, got.text
    return got.json()  # type: ignore[no-any-return]


def pull(c: httpx.Client, group: str, member: dict[str, Any], **params: Any) -> httpx.Response:
    return c.get(
        f"/groups/{group}/members/{member['member_id']}/records",
        params={"generation": member["generation"], "wait_ms": 0, **params},
    )


def amounts(records: list[dict[str, Any]]) -> list[int]:
    return [r["value"]["data"]["amount"] for r in records]


def test_pull_commit_fencing_and_reset(setup: Setup) -> None:
    setup.write(30)
    with setup.serve(), httpx.Client(base_url=setup.base, timeout=30) as c:
        a = join(c, "g", member_id="a")
        assert a["assignments"] == [{"topic": TOPIC, "partition": p} for p in range(3)]
        got = pull(c, "g", a, max_records=1000)
        assert got.status_code == 200, got.text
        records = got.json()["records"]
        assert sorted(amounts(records)) == list(range(30))
        first = records[0]
        assert set(first) == {"topic", "partition", "offset", "timestamp_ms", "key", "value", "headers"}
        assert first["key"] == orjson.dumps(first["value"]["stream"]).decode() and first["headers"] == {}
        for p in range(3):
            offsets = [r["offset"] for r in records if r["partition"] == p]
            assert offsets == list(range(len(offsets)))

        # a long poll returns as soon as a record is committed
        def later() -> None:
            time.sleep(0.5)
            setup.write(1)

        threading.Thread(target=later).start()
        started = time.monotonic()
        waited = c.get(
            f"/groups/g/members/{a['member_id']}/records",
            params={"generation": a["generation"], "wait_ms": 60_000},
            timeout=90,
        ).json()["records"]
        assert amounts(waited) == [30] and time.monotonic() - started < 30  # woken, long before its 60 s
        # and comes back empty after wait_ms
        started = time.monotonic()
        assert pull(c, "g", a, wait_ms=300).json()["records"] == []
        assert 0.25 < time.monotonic() - started < 5

        offsets = [{"topic": TOPIC, "partition": p, "offset": 2} for p in range(3)]
        ok = c.post("/groups/g/members/a/commit", json={"generation": a["generation"], "offsets": offsets})
        assert ok.status_code == 200, ok.text
        b = join(c, "g", member_id="b")
        stale = c.post("/groups/g/members/a/commit", json={"generation": a["generation"], "offsets": offsets})
        assert stale.status_code == 409 and stale.json()["code"] == "fenced"
        assert stale.json()["generation"] == b["generation"]
        assert pull(c, "g", a).json()["code"] == "fenced"
        beat = c.post("/groups/g/members/a/heartbeat", json={"generation": a["generation"]}).json()
        assert beat["rebalance"] and beat["generation"] == b["generation"]
        assert len(beat["assignments"]) + len(b["assignments"]) == 3

        described = c.get("/groups/g").json()
        assert {m["member_id"] for m in described["members"]} == {"a", "b"}
        assert [x["committed"] for x in described["partitions"]] == [2, 2, 2]
        assert described["lag"] == 31 - 6
        assert c.get("/groups").json() == [{"group": "g", "members": 2, "generation": b["generation"], "lag": 25}]

        busy = c.post("/groups/g/reset", json={"to": "earliest"})
        assert busy.status_code == 409 and busy.json()["code"] == "group_not_empty"
        assert c.delete("/groups/g/members/a").status_code == 204
        assert c.delete("/groups/g/members/b").status_code == 204
        gone = c.post("/groups/g/members/a/heartbeat", json={"generation": beat["generation"]})
        assert gone.status_code == 409 and gone.json()["code"] == "unknown_member"
        reset = c.post("/groups/g/reset", json={"to": "datetime", "datetime": "2023-11-14T22:13:20.025"})
        assert reset.status_code == 200, reset.text
        again = join(c, "g", member_id="a")
        assert sorted(amounts(pull(c, "g", again, max_records=1000).json()["records"])) == list(range(25, 31))

        lag = 'tributary_consumer_lag_records{group="g",partition="0",topic="events.account"}'
        wait_progress(lambda: lag in c.get("/metrics").text, lambda: None, what="a refresh of the gauges")
        assert "/groups/{group}/members/{member_id}/records" in c.get("/openapi.json").json()["paths"]


def _events(response: httpx.Response, want: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for line in response.iter_lines():
        if line == "":
            if current:
                out.append(current)
                current = {}
            if len([e for e in out if e.get("event") == "record"]) >= want:
                return out
            continue
        field, _, value = line.partition(": ")
        current[field] = value
    return out


def test_stream_resumes_after_last_event_id_and_follows_rebalances(setup: Setup) -> None:
    setup.write(12)
    with setup.serve(), httpx.Client(base_url=setup.base, timeout=30) as c:
        a = join(c, "s", member_id="a")
        url = f"/groups/s/members/a/stream?generation={a['generation']}"
        with c.stream("GET", url) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = [e for e in _events(r, 5) if e.get("event") == "record"]
        last = events[4]
        topic, partition, offset = last["id"].rsplit("/", 2)
        data = orjson.loads(last["data"])
        assert (data["topic"], data["partition"], data["offset"]) == (topic, int(partition), int(offset))
        # nothing committed: a new stream starts at offset 0, except after Last-Event-ID's partition
        with c.stream("GET", url, headers={"Last-Event-ID": last["id"]}) as r:
            again = [orjson.loads(e["data"]) for e in _events(r, 12 - int(offset) - 1) if e.get("event") == "record"]
        same = [e["offset"] for e in again if e["partition"] == int(partition)]
        assert same and same[0] == int(offset) + 1

        with c.stream("GET", url) as r:
            lines = r.iter_lines()
            while next(lines) != "":
                pass  # the retry hint
            join(c, "s", member_id="b")  # a rebalance while streaming
            seen: list[str] = []
            for line in lines:
                seen.append(line)
                if line == "event: rebalance":
                    break
            data = orjson.loads(next(lines).partition(": ")[2])
            assert data["generation"] == a["generation"] + 1 and len(data["assignments"]) in (1, 2)


def test_committed_offsets_survive_kill_9_of_the_server(setup: Setup) -> None:
    setup.write(20)
    with setup.serve() as proc, httpx.Client(base_url=setup.base, timeout=30) as c:
        a = join(c, "k", member_id="a")
        records = pull(c, "k", a, max_records=1000).json()["records"]
        commit = {(r["topic"], r["partition"]): r["offset"] + 1 for r in records[:8]}
        body = {
            "generation": a["generation"],
            "offsets": [{"topic": t, "partition": p, "offset": o} for (t, p), o in commit.items()],
        }
        assert c.post("/groups/k/members/a/commit", json=body).status_code == 200
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with setup.serve(), httpx.Client(base_url=setup.base, timeout=30) as c:
        described = c.get("/groups/k").json()
        committed = {
            (x["topic"], x["partition"]): x["committed"] for x in described["partitions"] if x["committed"] is not None
        }
        assert committed == commit
        a = join(c, "k", member_id="a")  # the same member, still in its session: positions restart at the commit
        again = pull(c, "k", a, max_records=1000).json()["records"]
        firsts = {(r["topic"], r["partition"]): r["offset"] for r in reversed(again)}
        for tp, o in commit.items():
            assert firsts.get(tp, o) == o


def test_a_reader_that_stops_reading_holds_only_its_own_stream(setup: Setup) -> None:
    """One stream's client reads nothing (its socket's receive buffer is tiny); another group's
    consumer still gets every record at once, and the server answers as usual."""
    import socket

    setup.write(5)
    with setup.serve(), httpx.Client(base_url=setup.base, timeout=30) as c:
        stuck = join(c, "stuck", member_id="s")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", setup.port))
        request = f"GET /groups/stuck/members/s/stream?generation={stuck['generation']} HTTP/1.1\r\nHost: x\r\n\r\n"
        sock.sendall(request.encode())
        setup.write(8_000)  # megabytes of events for a reader that takes none
        time.sleep(1)
        other = join(c, "other", member_id="o")
        got = [0]

        def pulled() -> bool:
            got[0] += len(pull(c, "other", other, max_records=5000, wait_ms=1000).json()["records"])
            return got[0] >= setup.n

        wait_progress(pulled, lambda: got[0], what="every record for the other group")
        assert got[0] == setup.n
        assert c.get("/healthz").status_code == 200
        sock.close()


def test_a_closed_stream_stops_keeping_its_member_alive(setup: Setup) -> None:
    with setup.serve(), httpx.Client(base_url=setup.base, timeout=30) as c:
        a = join(c, "gone", member_id="a", session_timeout_ms=3000)
        with c.stream("GET", f"/groups/gone/members/a/stream?generation={a['generation']}") as r:
            lines = r.iter_lines()  # kept: closing the iterator closes the connection
            next(lines)
            time.sleep(4)  # longer than the session timeout: the open stream keeps the member alive
            assert c.get("/groups/gone").json()["members"][0]["alive"]

        def members() -> tuple[tuple[str, bool], ...]:
            return tuple((m["member_id"], m["alive"]) for m in c.get("/groups/gone").json()["members"])

        wait_progress(lambda: not members(), members, what="the member to go with its closed stream")


def test_two_server_processes_share_the_groups(setup: Setup) -> None:
    """`[api] workers = 2`: members, positions and fencing live in the database, so requests that land
    on either process see one group: each record is delivered once, and a stale commit is refused."""
    setup.write(60)
    setup.config.write_text(setup.config.read_text().replace("[consumers]", "workers = 2\n[consumers]"))
    with setup.serve():

        def fresh() -> httpx.Client:  # a new connection: either worker may answer it
            return httpx.Client(base_url=setup.base, timeout=30)

        with fresh() as c:
            a = join(c, "w", member_id="a")
        records: list[dict[str, Any]] = []
        for _ in range(40):
            with fresh() as c:
                records += pull(c, "w", a, max_records=5).json()["records"]
        assert sorted(amounts(records)) == list(range(60))
        with fresh() as c:
            join(c, "w", member_id="b")
        with fresh() as c:
            body = {"generation": a["generation"], "offsets": [{"topic": TOPIC, "partition": 0, "offset": 1}]}
            assert c.post("/groups/w/members/a/commit", json=body).json()["code"] == "fenced"


def test_sigterm_ends_open_streams_and_long_polls_so_the_server_stops(setup: Setup) -> None:
    with setup.serve() as proc, httpx.Client(base_url=setup.base, timeout=30) as c:
        a = join(c, "t", member_id="a")
        with c.stream("GET", f"/groups/t/members/a/stream?generation={a['generation']}") as r:
            lines = r.iter_lines()
            next(lines)

            def beat() -> str:
                return str(c.get("/groups/t").json()["members"][0]["last_heartbeat"])

            before = beat()
            waiting = threading.Thread(target=lambda: pull(c, "t", a, wait_ms=60_000))
            waiting.start()
            wait_progress(lambda: beat() != before, lambda: None, what="the long poll to reach the server")
            started = time.monotonic()
            proc.terminate()
            # (uvicorn re-raises the signal once it has shut down)
            wait_exit(proc, what="serve to stop", progress=lambda: size_of(setup.tmp / "serve.err"))
            # the stream ended, long before the long poll's 60 s
            assert [line for line in lines if line] == [] and time.monotonic() - started < 30
            wait_threads([waiting], what="the long poll to end", progress=lambda: None)
