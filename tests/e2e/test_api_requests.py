"""What every request gets from a real `tributary serve`: a request id (in the response and in the
server's log), a count in `tributary_http_requests_total`; HTTP/1.1 keep-alive, pipelining and
`Connection: close` as uvicorn serves them; and view values as PostgreSQL spells them (numeric)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.pg import PgServer, fresh_database
from tests.servers import free_port, serving
from tests.waiting import wait_progress

pytestmark = pytest.mark.e2e

MODULE = """
from tributary.projections.definition import Projection, Table

PROJECTIONS = [
    Projection(name="nums", version=1, topics=("none",), build=lambda df: df,
               table=Table.of({"id": "bigint", "v": "numeric", "at": "timestamptz"}, ["id"])),
    # declares a column its table lacks: the query fails in PostgreSQL, which is the server's error (500)
    Projection(name="broken", version=1, topics=("none",), build=lambda df: df,
               table=Table.of({"id": "bigint", "missing": "text"}, ["id"])),
]
"""
# PostgreSQL's spelling of each value (what `numeric_out` prints); Python's str(Decimal) would
# write some of them with an exponent (1E-7, 1.5E+20 is not one of them: Decimal keeps digits).
NUMS = ["0.0000001", "-12.50", "150000000000000000000", "NaN", "Infinity", "3"]


class Served:
    def __init__(self, base: str, err: Path) -> None:
        self.base = base
        self.err = err
        self.client = httpx.Client(base_url=base, timeout=30)

    def log_records(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.err.read_text().splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def served(pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("requests")
    (tmp / "views.py").write_text(MODULE)
    with fresh_database(pg_server) as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA views")
            conn.execute("CREATE TABLE views.nums (id bigint PRIMARY KEY, v numeric, at timestamptz)")
            conn.execute("CREATE TABLE views.broken (id bigint PRIMARY KEY)")
            for i, v in enumerate(NUMS, 1):
                conn.execute("INSERT INTO views.nums VALUES (%s, %s::numeric, '2026-01-01T00:00:00Z')", (i, v))
        port = free_port()
        config = tmp / "t.toml"
        config.write_text(
            f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{tmp / "log"}"\n'
            f'[projections]\nmodules = ["{tmp / "views.py"}"]\n[api]\nport = {port}\n'
        )
        err = tmp / "serve.err"
        with serving(config, port, err_path=err) as base:
            s = Served(base, err)
            try:
                yield s
            finally:
                s.client.close()


def test_numeric_values_keep_postgresql_spelling_and_page_by_cursor(served: Served) -> None:
    got = served.client.get("/views/nums", params={"limit": 100})
    assert got.status_code == 200, got.text
    assert [r["v"] for r in got.json()["rows"]] == NUMS
    assert got.json()["rows"][0]["at"] == "2026-01-01T00:00:00+00:00"
    # ordered by the numeric column, two rows a page, every row once (the cursor carries the text)
    seen, cursor = [], None
    while True:
        page = served.client.get(
            "/views/nums", params={"order_by": "v", "limit": 2, **({"cursor": cursor} if cursor else {})}
        )
        assert page.status_code == 200, page.text
        seen += [r["id"] for r in page.json()["rows"]]
        if (cursor := page.json()["next_cursor"]) is None:
            break
    with psycopg.connect(_dsn_of(served)) as conn:
        want = [r[0] for r in conn.execute("SELECT id FROM views.nums ORDER BY v, id")]
    assert seen == want
    assert served.client.get("/views/nums", params={"v__gt": "1E-8"}).json()["rows"][0]["v"] == "0.0000001"


def _dsn_of(served: Served) -> str:
    config = next(served.err.parent.glob("t.toml")).read_text()
    return config.split('dsn = "', 1)[1].split('"', 1)[0]


def test_request_ids_in_responses_and_log(served: Served) -> None:
    ids = [served.client.get(path).headers["x-request-id"] for path in ("/views/nums?id=1", "/healthz", "/nowhere")]
    assert len(set(ids)) == 3 and all(ids)
    assert served.client.get("/views/nums?id=1", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == (
        "abc-123"
    )
    for bad in ("a" * 65, "two words", "<script>"):  # not echoed: a new id instead
        assert served.client.get("/healthz", headers={"X-Request-ID": bad}).headers["x-request-id"] != bad
    failed = served.client.get("/views/broken", headers={"X-Request-ID": "trace-500"})
    assert failed.status_code == 500 and failed.json() == {
        "type": "urn:tributary:problem:internal_error",
        "title": "Internal error",
        "status": 500,
        "detail": "internal error; see the server log",
        "code": "internal_error",
    }
    assert failed.headers["x-request-id"] == "trace-500"
    errors = [r for r in served.log_records() if r["level"] == "error"]
    assert any(r.get("request_id") == "trace-500" and "missing" in r.get("exc", "") for r in errors), errors
    assert all("request_id" not in r for r in served.log_records() if r["logger"] == "tributary.serve")


def _requests_total(served: Served) -> dict[tuple[str, str, str], float]:
    text = served.client.get("/metrics").text
    family = next(f for f in text_string_to_metric_families(text) if f.name == "tributary_http_requests")
    return {
        (s.labels["method"], s.labels["route"], s.labels["status"]): s.value
        for s in family.samples
        if s.name.endswith("_total")
    }


def test_requests_counted_by_route_template_and_status(served: Served) -> None:
    before = _requests_total(served)
    for path in ("/views/nums?id=1", "/views/nums?id=2", "/views/nums?nope=1", "/views/absent", "/nowhere/9"):
        served.client.get(path)
    served.client.post("/views/nums")
    after = _requests_total(served)

    def delta(key: tuple[str, str, str]) -> float:
        return after.get(key, 0) - before.get(key, 0)

    assert delta(("GET", "/views/{name}", "200")) == 2
    assert delta(("GET", "/views/{name}", "422")) == 1  # the route's own error
    assert delta(("GET", "/views/{name}", "404")) == 1
    assert delta(("GET", "unmatched", "404")) == 1  # no raw path as a label: bounded series
    assert delta(("POST", "/views/{name}", "405")) == 1
    assert delta(("GET", "/metrics", "200")) == 1  # the scrape before this one


def _responses(sock: socket.socket, count: int) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    """`count` responses read off a keep-alive socket: status line, headers (lower-case), body."""
    sock.settimeout(10)  # a response that never comes fails the test instead of hanging it
    buf, out = b"", []
    while len(out) < count:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(out)} responses"
            buf += chunk
        head, _, buf = buf.partition(b"\r\n\r\n")
        status, *lines = head.split(b"\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines)}
        length = int(headers[b"content-length"])
        while len(buf) < length:
            buf += sock.recv(65536)
        out.append((status, headers, buf[:length]))
        buf = buf[length:]
    return out


def _port(served: Served) -> int:
    return int(served.base.rsplit(":", 1)[1])


def test_pipelined_requests_answered_in_order(served: Served) -> None:
    """Requests sent in one write, mixing view pages with errors (a 422, a 404) and /healthz: one
    response each, in request order, the connection kept open."""
    targets = [b"/views/nums?id=1", b"/views/nums?nope=1", b"/views/nums?id=2", b"/healthz", b"/views/absent"]
    targets += [b"/views/nums?id=%d" % i for i in range(1, 7)]
    with socket.create_connection(("127.0.0.1", _port(served))) as sock:
        sock.sendall(
            b"".join(b"GET %s HTTP/1.1\r\nHost: t\r\nX-Request-ID: r%d\r\n\r\n" % (t, i) for i, t in enumerate(targets))
        )
        got = _responses(sock, len(targets))
        sock.sendall(b"GET /views/nums?id=3 HTTP/1.1\r\nHost: t\r\n\r\n")  # still open after the burst
        (last,) = _responses(sock, 1)
    assert [s.split(b" ")[1] for s, _, _ in got] == [b"200", b"422", b"200", b"200", b"404"] + [b"200"] * 6
    assert [h[b"x-request-id"] for _, h, _ in got] == [b"r%d" % i for i in range(len(targets))]
    assert orjson.loads(got[2][2])["rows"][0]["id"] == 2
    assert [orjson.loads(b)["rows"][0]["id"] for _, _, b in got[5:]] == list(range(1, 7))
    for _, headers, _ in got:
        assert b"date" in headers and headers[b"server"] == b"uvicorn"  # uvicorn's default headers
    assert last[0].startswith(b"HTTP/1.1 200") and orjson.loads(last[2])["rows"][0]["id"] == 3


@pytest.mark.parametrize(
    "request_line", [b"GET /views/nums?id=1 HTTP/1.1\r\nConnection: close", b"GET /views/nums?id=1 HTTP/1.0"]
)
def test_connection_close_and_http_1_0_answered_then_closed(served: Served, request_line: bytes) -> None:
    with socket.create_connection(("127.0.0.1", _port(served))) as sock:
        sock.sendall(request_line + b"\r\nHost: t\r\n\r\n")
        sock.settimeout(10)
        data = b""
        while chunk := sock.recv(65536):  # the server closes after the response
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"\r\nconnection: close" in head.lower()
    assert orjson.loads(body)["rows"][0]["id"] == 1


def test_a_client_gone_before_its_response_leaves_the_server_serving(served: Served) -> None:
    port = _port(served)
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /views/nums?limit=100 HTTP/1.1\r\nHost: t\r\n\r\n")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    got = served.client.get("/views/nums", params={"id": 4})
    assert got.status_code == 200 and got.json()["rows"][0]["id"] == 4
    assert not [r for r in served.log_records() if r["level"] == "error" and "trace-500" not in str(r)]


def test_requests_written_behind_an_unanswered_one_are_answered_in_order(served: Served) -> None:
    """Each request its own write, sent before the previous one is answered (uvicorn queues it behind
    the one in flight): the answers come in request order on the one connection."""
    targets = [b"/views/nums?limit=100", b"/healthz", b"/views/nums?id=2", b"/views/nums?nope=1", b"/views/nums?id=5"]
    with socket.create_connection(("127.0.0.1", _port(served))) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i, target in enumerate(targets):
            sock.sendall(b"GET %s HTTP/1.1\r\nHost: t\r\nX-Request-ID: w%d\r\n\r\n" % (target, i))
        got = _responses(sock, len(targets))
    assert [h[b"x-request-id"] for _, h, _ in got] == [b"w%d" % i for i in range(len(targets))]
    assert [s.split(b" ")[1] for s, _, _ in got] == [b"200", b"200", b"200", b"422", b"200"]
    assert len(orjson.loads(got[0][2])["rows"]) == len(NUMS)
    assert [orjson.loads(got[i][2])["rows"][0]["id"] for i in (2, 4)] == [2, 5]


def test_idle_keep_alive_connection_closed_after_the_timeout_and_not_while_in_use(served: Served) -> None:
    """uvicorn's keep-alive timeout (5 s) after view responses: a connection used every 1.2 s for 6 s
    stays open; left idle, the server closes it about 5 s after its last response."""
    with socket.create_connection(("127.0.0.1", _port(served))) as sock:
        for i in range(6):
            sock.sendall(b"GET /views/nums?id=%d HTTP/1.1\r\nHost: t\r\n\r\n" % (i + 1))
            ((status, _, body),) = _responses(sock, 1)
            assert status.startswith(b"HTTP/1.1 200") and orjson.loads(body)["rows"][0]["id"] == i + 1
            if i < 5:
                time.sleep(1.2)
        answered = time.monotonic()
        sock.settimeout(15)
        assert sock.recv(65536) == b""  # closed by the server
        assert 4.5 < time.monotonic() - answered < 8


def test_a_500_is_logged_once_and_keeps_the_connection(served: Served) -> None:
    """The app's error handler logs an unexpected error and answers 500; the server neither logs it
    again nor closes the keep-alive connection."""
    with socket.create_connection(("127.0.0.1", _port(served))) as sock:
        sock.sendall(b"GET /views/broken HTTP/1.1\r\nHost: t\r\nX-Request-ID: once-500\r\n\r\n")
        ((status, _, _),) = _responses(sock, 1)
        assert status.startswith(b"HTTP/1.1 500")
        sock.sendall(b"GET /views/nums?id=2 HTTP/1.1\r\nHost: t\r\n\r\n")
        ((status, _, body),) = _responses(sock, 1)
    assert status.startswith(b"HTTP/1.1 200") and orjson.loads(body)["rows"][0]["id"] == 2

    def logged() -> int:  # the log line is written before the response; the file catches up
        return sum(r.get("request_id") == "once-500" for r in served.log_records() if r["level"] == "error")

    wait_progress(lambda: logged() > 0, logged, what="the 500's log line")
    time.sleep(0.2)  # a quiet while: a second line for it would show by now
    errors = [r for r in served.log_records() if r["level"] == "error"]
    assert [r.get("request_id") for r in errors if "missing" in r.get("exc", "")].count("once-500") == 1
    assert not [r for r in errors if r["logger"] == "uvicorn.error"], errors
