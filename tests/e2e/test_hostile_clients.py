"""Hostile clients against a real `tributary serve`: none of these needs a key, each once hurt the
server. Memory per connection is bounded (head bytes capped, no queue of pipelined requests),
connections that never finish a request are closed and cannot exhaust the open-files limit,
metric labels come from bounded sets, /readyz and /metrics cost nothing per call, and slow view
queries are cut at `[api] statement_timeout_ms`.

Every attack sends a bounded amount over loopback and stops by itself (socket timeouts)."""

from __future__ import annotations

import contextlib
import os
import random
import resource
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from tests.servers import free_port, served
from tests.waiting import wait_progress

pytestmark = pytest.mark.e2e

MB = 1024 * 1024
RSS_BOUND = 40 * MB  # what one attack may add to the server's resident memory

VIEWS = """
from tributary.projections.definition import Projection, Table

PROJECTIONS = [
    Projection(name="fast", version=1, topics=("none",), table=Table.of({"id": "bigint", "v": "text"}, ["id"]),
               build=lambda df: df),
    Projection(name="slow", version=1, topics=("none",), table=Table.of({"id": "bigint", "v": "text"}, ["id"]),
               build=lambda df: df),
]
"""


class Server:
    """A running `tributary serve` process and how to reach it."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, err: Path) -> None:
        self.proc, self.port, self.err = proc, port, err
        self.base = f"http://127.0.0.1:{port}"

    def rss(self) -> int:
        """Resident bytes of the server process (VmRSS)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def connect(self, timeout: float = 5) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def log_lines(self) -> int:
        return len(self.err.read_text().splitlines())

    def open_files(self) -> int:
        """File descriptors the server holds (each accepted connection is one)."""
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


@contextlib.contextmanager
def serve(
    dsn: str,
    tmp_path: Path,
    api: str = "",
    *,
    http: str,
    preexec: Callable[[], None] | None = None,
    extra: str = "",
) -> Iterator[Server]:
    """`tributary serve` on a free port with the parser `http` and `[api]` lines `api` (and other
    sections `extra`)."""
    port = free_port()
    config = tmp_path / f"serve-{port}.toml"
    config.write_text(
        f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{tmp_path / "log"}"\n{extra}\n[api]\nport = {port}\nhttp = "{http}"\n{api}\n'
        '[eventstore]\nmodules = ["tributary.eventstore.examples.bank"]\n'
    )
    err = tmp_path / f"serve-{port}.err"
    with served(config, port, err_path=err, ready="/readyz", preexec_fn=preexec) as proc:
        yield Server(proc, port, err)


def _settle(server: Server) -> int:
    """The server's RSS once warmed up: a few hundred ordinary requests first."""
    with httpx.Client(base_url=server.base) as client:
        for _ in range(300):
            client.get("/healthz")
    time.sleep(0.5)
    return server.rss()


def _send_until_refused(sock: socket.socket, chunk: bytes, total: int) -> int:
    """Send `chunk` until `total` bytes went, the server closed, or a send blocked for the socket's
    timeout (the server stopped reading); the bytes sent."""
    sent = 0
    with contextlib.suppress(OSError):  # reset, broken pipe or timeout: the server stopped taking it
        while sent < total:
            sent += sock.send(chunk)
    return sent


def test_huge_header_is_refused_and_memory_stays_bounded(db: str, tmp_path: Path, http: str) -> None:
    with serve(db, tmp_path, http=http) as server:
        for size in (20_000, 65_536, 4 * MB):  # a head past [api] max_header_bytes: 431 (or 400) and closed
            with server.connect() as sock:
                with contextlib.suppress(OSError):  # (the server may close before it has all of it)
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * size + b"\r\n\r\n")
                answer = sock.recv(4096)
                assert answer.startswith((b"HTTP/1.1 431 ", b"HTTP/1.1 400 ")), (size, answer)
        idle = _settle(server)
        with server.connect() as sock:  # 300 MB of one header, as fast as the server takes it
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
            sent = _send_until_refused(sock, b"a" * MB, 300 * MB)
        grown = server.rss() - idle
        assert grown < RSS_BOUND, f"RSS grew by {grown / MB:.1f} MB after {sent / MB:.0f} MB of header"
        assert httpx.get(server.base + "/healthz").status_code == 200


def test_pipelining_without_reading_answers_keeps_memory_bounded(db: str, tmp_path: Path, http: str) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    chunk = request * (MB // len(request))
    with serve(db, tmp_path, http=http) as server:
        idle = _settle(server)
        peak = 0
        socks = []
        for _ in range(4):  # four connections that pipeline and never read
            sock = server.connect(timeout=3)
            socks.append(sock)
            _send_until_refused(sock, chunk, 200 * MB)
            peak = max(peak, server.rss())
        time.sleep(1)
        grown = max(peak, server.rss()) - idle
        for sock in socks:
            sock.close()
        assert grown < RSS_BOUND, f"RSS grew by {grown / MB:.1f} MB"
        assert httpx.get(server.base + "/healthz").status_code == 200


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128))


def test_silent_connections_cannot_lock_out_a_client(db: str, tmp_path: Path, http: str) -> None:
    timeout_s = 3.0
    with serve(db, tmp_path, f"request_timeout_s = {timeout_s}", http=http, preexec=_limit_files) as server:
        silent = [server.connect() for _ in range(140)]
        try:
            time.sleep(0.5)
            started = time.monotonic()
            answer = httpx.get(server.base + "/healthz", timeout=timeout_s + 5)
            assert answer.status_code == 200
            assert time.monotonic() - started < timeout_s
            # the silent ones still open are closed once the timeout passes
            last = silent[-1]
            last.settimeout(0.2)
            got: list[bytes] = []

            def ended() -> bool:
                try:
                    got.append(last.recv(1))
                except TimeoutError:
                    return False
                return True

            wait_progress(ended, server.open_files, what="the last silent connection to be closed")
            assert got == [b""]
        finally:
            for sock in silent:
                sock.close()


def test_a_trickled_request_gets_408_and_is_closed(db: str, tmp_path: Path, http: str) -> None:
    timeout_s = 2.0
    with serve(db, tmp_path, f"request_timeout_s = {timeout_s}", http=http) as server, server.connect() as sock:
        # one full request first: the deadline also holds between requests on a kept-alive connection
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b'{"status":"ok"}'):
            first += sock.recv(4096)
        assert first.startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        answer = b""
        with contextlib.suppress(OSError):
            for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 100:
                sock.send(bytes([byte]))
                time.sleep(0.2)
                sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    answer += sock.recv(4096)
                sock.setblocking(True)
                if answer:
                    break
        elapsed = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert elapsed < timeout_s + 1.5
    with serve(db, tmp_path, f"request_timeout_s = {timeout_s}", http=http) as server, server.connect() as sock:
        # a body that never completes: the connection is closed once the timeout has passed
        sock.sendall(b"POST /commands/account/slow HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        sock.sendall(b'Content-Length: 100\r\n\r\n{"type": "open"')
        started = time.monotonic()
        sock.settimeout(timeout_s + 5)
        with contextlib.suppress(ConnectionResetError):
            while sock.recv(4096):
                pass
        assert time.monotonic() - started < timeout_s + 1.5


def _metrics_size(base: str) -> int:
    return len(httpx.get(base + "/metrics").content)


def test_metric_labels_stay_bounded(db: str, tmp_path: Path, http: str) -> None:
    rng = random.Random(17)

    def word() -> str:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(12))

    with serve(db, tmp_path, http=http) as server, httpx.Client(base_url=server.base) as client:
        for _ in range(3):  # every family that the attack below could touch, once
            client.post("/commands/account/m-1", json={"type": "open", "data": {"owner": "m"}})
            client.post("/commands/nope/x", json={"type": "open", "data": {}})
            client.get("/nowhere")
            client.request("BREW", "/healthz")
        before = _metrics_size(server.base)
        for i in range(3000):
            kind = i % 3
            if kind == 0:
                client.post(f"/commands/{word()}/{word()}", json={"type": "open", "data": {}})
            elif kind == 1:
                client.get(f"/{word()}/{word()}")
            else:
                client.request(word().upper(), f"/streams/{word()}")
        after = _metrics_size(server.base)
        assert after - before < 2048, f"/metrics grew from {before} to {after} bytes"


def _backends(conn: psycopg.Connection[Any], dbname: str) -> set[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (dbname,)
    ).fetchall()
    return {r[0] for r in rows}


def _settled(conn: psycopg.Connection[Any], dbname: str) -> set[int]:
    """The server's backends once its start has opened them all: the same set for a second."""
    last: list[tuple[set[int], float]] = [(_backends(conn, dbname), time.monotonic())]

    def still() -> bool:
        now = _backends(conn, dbname)
        if now != last[-1][0]:
            last.append((now, time.monotonic()))
        return time.monotonic() - last[-1][1] >= 1.0

    wait_progress(still, lambda: len(last), what="the server's connections to settle")
    return last[-1][0]


def test_readyz_and_metrics_open_no_connection_and_log_nothing_per_call(db: str, tmp_path: Path, http: str) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(db)["dbname"]
    with (
        serve(db, tmp_path, "status_refresh_s = 3600", http=http) as server,
        psycopg.connect(db, autocommit=True) as conn,
    ):
        seen: set[int] = set()
        stop = threading.Event()

        def watch() -> None:  # every backend that exists at any moment of the calls
            with psycopg.connect(db, autocommit=True) as watcher:
                while not stop.is_set():
                    seen.update(_backends(watcher, dbname))
                    time.sleep(0.002)

        before = _settled(conn, dbname)
        lines = server.log_lines()
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            with httpx.Client(base_url=server.base) as client:
                for _ in range(100):
                    assert client.get("/readyz").status_code == 200
                    assert client.get("/metrics").status_code == 200
        finally:
            stop.set()
            watcher.join()
        new = seen - before - {conn.info.backend_pid}  # (the watcher never sees itself)
        assert new == set(), f"{len(new)} new backends during 200 calls"
        assert server.log_lines() == lines, server.err.read_text()[-2000:]


def test_readyz_follows_the_database_down_and_back(db: str, tmp_path: Path, http: str) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(db)["dbname"]
    admin = db.rsplit("/", 1)[0] + "/postgres"
    with (
        serve(db, tmp_path, "status_refresh_s = 0.5", http=http) as server,
        psycopg.connect(admin, autocommit=True) as conn,
    ):

        def wait_for(status: int) -> None:
            answers: list[httpx.Response] = []

            def answered() -> bool:
                answers.append(httpx.get(server.base + "/readyz", timeout=10))
                return answers[-1].status_code == status

            wait_progress(  # the answer's checks move while the server notices
                answered, lambda: answers[-1].text if answers else None, what=f"/readyz to answer {status}"
            )

        conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(dbname)))
        try:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (dbname,))
            wait_for(503)
            assert "unreachable" in httpx.get(server.base + "/readyz").json()["checks"]["database"]
        finally:
            conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(dbname)))
        wait_for(200)


@pytest.fixture
def views(db: str, tmp_path: Path, http: str) -> Iterator[Server]:
    """A server with a fast view (a table) and a slow one (a view that sleeps 1 s per query)."""
    module = tmp_path / "edge_views.py"
    module.write_text(VIEWS)
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS views")
        conn.execute("CREATE TABLE views.fast (id bigint PRIMARY KEY, v text)")
        conn.execute("INSERT INTO views.fast SELECT g, 'v' || g FROM generate_series(1, 1000) g")
        conn.execute(
            "CREATE VIEW views.slow AS SELECT g::bigint AS id, 'v'::text AS v "
            "FROM generate_series(1, 3) g WHERE pg_sleep(1) IS NOT NULL"
        )
    extra = f'[projections]\nmodules = ["{module}"]\n'
    with serve(db, tmp_path, "statement_timeout_ms = 300", http=http, extra=extra) as server:
        yield server


def test_a_slow_view_query_gets_503_and_point_lookups_stay_fast(views: Server) -> None:
    results: list[httpx.Response] = []

    def slow() -> None:
        with httpx.Client(base_url=views.base, timeout=30) as c:
            results.append(c.get("/views/slow", params={"order_by": "v"}))

    threads = [threading.Thread(target=slow) for _ in range(8)]
    lookups = []
    with httpx.Client(base_url=views.base, timeout=30) as client:
        quiet = []  # what a lookup takes on this machine now, without the slow queries
        for i in range(20):
            started = time.monotonic()
            assert client.get("/views/fast", params={"id": i + 1}).status_code == 200
            quiet.append(time.monotonic() - started)
        for t in threads:
            t.start()
        for i in range(20):
            started = time.monotonic()
            assert client.get("/views/fast", params={"id": i + 1}).status_code == 200
            lookups.append(time.monotonic() - started)
    for t in threads:
        t.join()
    assert [r.status_code for r in results] == [503] * 8, [r.text for r in results]
    detail = results[0].json()["detail"]
    assert "statement_timeout_ms" in detail and "\n" not in detail
    # a lookup queued behind the slow queries waits for their statement_timeout_ms (0.3 s)
    assert sorted(lookups)[len(lookups) // 2] < 0.3 + sorted(quiet)[len(quiet) // 2], (lookups, quiet)


def test_prepared_statements_per_view_connection_are_bounded(db: str) -> None:
    import asyncio

    from tributary.api.http.routes_views import Views

    async def run() -> int:
        views = Views(db, "views", max_size=1, prepared_max=8)
        await views.open()
        try:
            for limit in range(1, 60):  # 59 shapes, each run past the prepare threshold
                text = f"SELECT g FROM generate_series(1, 100) g LIMIT {limit}"
                for _ in range(3):
                    await views.fetch(("shape", limit), text, [])
            async with views.pool.connection() as conn:
                cur = await conn.execute("SELECT count(*) AS n FROM pg_prepared_statements", prepare=False)
                row = await cur.fetchone()
                return int(row["n"])
        finally:
            await views.close()

    assert asyncio.run(run()) <= 8 + 1  # psycopg deallocates an evicted statement with the next query
