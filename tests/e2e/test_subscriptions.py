"""`GET /all/subscribe` as a client follows it: server-sent events from a position, new events as
they commit, and a server restart in the middle — the client resumes with `Last-Event-ID` (as a
browser's EventSource does) and ends with every event exactly once, in `$all` order."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.servers import free_port, served
from tests.waiting import wait_progress, wait_threads
from tributary.eventstore.migrate import run_migrations
from tributary.eventstore.model import NewEvent
from tributary.eventstore.store import EventStore

pytestmark = pytest.mark.e2e


class Follower(threading.Thread):
    """A minimal EventSource: reads `id:`/`data:` events, reconnects with `Last-Event-ID` after
    the stream ends or the server is away, until told to stop."""

    def __init__(self, url: str, params: dict[str, str] | None = None) -> None:
        super().__init__(daemon=True)
        self.url, self.params = url, params or {}
        self.events: list[tuple[int, dict[str, object]]] = []
        self.connections = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            headers = {"Last-Event-ID": str(self.events[-1][0])} if self.events else {}
            try:
                with httpx.stream("GET", self.url, params=self.params, headers=headers, timeout=5) as r:
                    assert r.status_code == 200, r.read()
                    assert r.headers["content-type"].startswith("text/event-stream")
                    self.connections += 1
                    event_id, data = None, None
                    for line in r.iter_lines():
                        if self.stop.is_set():
                            return
                        if line.startswith("id: "):
                            event_id = int(line[4:])
                        elif line.startswith("data: "):
                            data = orjson.loads(line[6:])
                        elif line == "" and event_id is not None and data is not None:
                            self.events.append((event_id, data))
                            event_id, data = None, None
            except (httpx.TransportError, httpx.StreamError):
                pass
            time.sleep(0.2)


@pytest.fixture
def setup(fresh_db: str, tmp_path: Path) -> Iterator[tuple[Path, int, EventStore]]:
    run_migrations(fresh_db)
    port = free_port()
    config = tmp_path / "t.toml"
    config.write_text(f'[service]\ndsn = "{fresh_db}"\n[log]\nroot = "{tmp_path / "log"}"\n[api]\nport = {port}\n')
    store = EventStore.connect(fresh_db, max_size=2)
    try:
        yield config, port, store
    finally:
        store.close()


def _wait(predicate: Callable[[], bool], what: str, progress: Callable[[], Hashable]) -> None:
    wait_progress(predicate, progress, what=what, poll=0.05)


def test_a_subscription_resumes_across_a_server_restart(setup: tuple[Path, int, EventStore], tmp_path: Path) -> None:
    config, port, store = setup
    for i in range(5):  # events before anyone subscribes: the catch-up part
        store.append(f"s{i % 3}", "thing" if i % 2 else "other", [NewEvent(type="Made", data={"i": i})])
    writing = threading.Event()
    written: list[int] = []

    def writer() -> None:  # appends all along, server up or down
        i = 5
        while writing.is_set():
            result = store.append(f"s{i % 3}", "thing" if i % 2 else "other", [NewEvent(type="Made", data={"i": i})])
            written.append(result.events[0].position)
            i += 1
            time.sleep(0.02)

    follower = Follower(f"http://127.0.0.1:{port}/all/subscribe")
    typed = Follower(f"http://127.0.0.1:{port}/all/subscribe", {"type": "thing"})
    writing.set()
    appender = threading.Thread(target=writer, daemon=True)
    appender.start()
    with served(config, port, err_path=tmp_path / "serve-1.err"):
        follower.start()
        typed.start()
        _wait(lambda: len(follower.events) >= 20, "live events before the restart", lambda: len(follower.events))
    during, down_at = len(follower.events), len(written)
    _wait(lambda: len(written) > down_at + 10, "appends while the server is down", lambda: len(written))
    with served(config, port, err_path=tmp_path / "serve-2.err"):
        _wait(
            lambda: follower.connections >= 2 and typed.connections >= 2,
            "the reconnections",
            lambda: (follower.connections, typed.connections, len(follower.events)),
        )
        up_at = len(written)
        _wait(lambda: len(written) > up_at + 10, "appends while followed again", lambda: len(written))
        writing.clear()
        wait_threads([appender], what="the last append", progress=lambda: len(written))
        expected = [e.position for e in store.read_all(limit=100_000)]
        _wait(lambda: [p for p, _ in follower.events] == expected, "every event once", lambda: len(follower.events))
        thing = [e.position for e in store.read_all(limit=100_000, stream_type="thing")]
        _wait(lambda: [p for p, _ in typed.events] == thing, "every `thing` event once", lambda: len(typed.events))
        follower.stop.set()
        typed.stop.set()
    assert during < len(expected)  # the restart happened in the middle of the stream
    assert [d["position"] for _, d in follower.events] == expected
    assert {d["stream_type"] for _, d in typed.events} == {"thing"}
    stopped = (tmp_path / "serve-1.err").read_text()  # subscriptions end at once when the server stops
    assert "Traceback" not in stopped and "graceful shutdown exceeded" not in stopped


def test_subscribe_refuses_an_unknown_position(setup: tuple[Path, int, EventStore], tmp_path: Path) -> None:
    config, port, store = setup
    store.append("s", "t", [NewEvent(type="Made", data={})])
    with served(config, port, err_path=tmp_path / "serve.err"):
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(base + "/all/subscribe", params={"after": 77}).status_code == 404
        assert httpx.get(base + "/all/subscribe", headers={"Last-Event-ID": "x1"}).status_code == 422
        assert httpx.get(base + "/all/subscribe", headers={"Last-Event-ID": "9" * 19}).status_code == 404
        head = httpx.head(base + "/all/subscribe", timeout=5)  # answered, not a stream left open
        assert head.status_code == 200 and head.headers["content-type"].startswith("text/event-stream")


def test_subscription_settings_come_from_the_config(
    setup: tuple[Path, int, EventStore], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`[api] subscription_keepalive_s` (here 1 s, from the file) and `subscription_page` (here 2,
    from the environment) reach the server: an idle subscription sends its comment line within
    the second, and the stored events come in pages of 2 (each page one chunk of the body)."""
    config, port, store = setup
    config.write_text(config.read_text() + "subscription_keepalive_s = 1\nsubscription_poll_s = 0.05\n")
    monkeypatch.setenv("TRIBUTARY_API__SUBSCRIPTION_PAGE", "2")
    for i in range(5):
        store.append("p", "thing", [NewEvent(type="Made", data={"i": i})])
    with served(config, port, err_path=tmp_path / "serve.err"):
        chunks: list[bytes] = []
        started = time.monotonic()
        with httpx.stream("GET", f"http://127.0.0.1:{port}/all/subscribe", timeout=10) as r:
            for chunk in r.iter_raw():
                chunks.append(chunk)
                if b": keep-alive" in chunk:
                    break
        waited = time.monotonic() - started
    body = b"".join(chunks)
    assert body.count(b"\ndata: ") == 5 and body.endswith(b": keep-alive\n\n")
    assert waited < 5  # the default (15 s) would not have answered yet
    pages = [c.count(b"\ndata: ") for c in chunks if b"data: " in c]
    assert max(pages) <= 2 and sum(pages) == 5, pages


def test_all_and_subscribe_filter_by_stream_prefix_and_event_types_on_the_server(
    setup: tuple[Path, int, EventStore], tmp_path: Path
) -> None:
    config, port, store = setup
    kinds = ["Opened", "Deposited", "Closed"]
    for i in range(12):
        store.append(f"{'acct' if i % 2 else 'user'}-{i % 4}", "thing", [NewEvent(type=kinds[i % 3], data={"i": i})])
    every = store.read_all(limit=1000)
    want = [e.position for e in every if e.stream_id.startswith("acct-") and e.type in ("Opened", "Closed")]
    assert 0 < len(want) < len(every)
    only = {"stream": "acct-", "event_type": ["Opened", "Closed"]}
    with served(config, port, err_path=tmp_path / "serve.err"):
        base = f"http://127.0.0.1:{port}"
        got: list[int] = []
        after = 0
        while True:  # paged with a small limit: `next` continues after the last match
            page = httpx.get(base + "/all", params={**only, "after": after, "limit": 2}, timeout=10).json()
            got += [e["position"] for e in page["events"]]
            if not page["events"]:
                break
            after = page["next"]
        assert got == want
        types = httpx.get(base + "/all", params={"event_type": "Deposited"}, timeout=10).json()["events"]
        assert {e["type"] for e in types} == {"Deposited"} and len(types) == 4
        one = httpx.get(base + "/all", params={"stream": "user-0"}, timeout=10).json()["events"]
        assert {e["stream"] for e in one} == {"user-0"} and len(one) == 3
        follower = Follower(base + "/all/subscribe", only)
        follower.start()
        late = store.append("acct-9", "thing", [NewEvent(type="Closed", data={})]).events[0].position
        store.append("acct-9", "thing", [NewEvent(type="Deposited", data={})])
        _wait(
            lambda: [p for p, _ in follower.events] == [*want, late],
            "the filtered events",
            lambda: len(follower.events),
        )
        follower.stop.set()
