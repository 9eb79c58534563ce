"""Request bodies through the connection guard, under both parsers, against a real `tributary serve`:
a large body is read whole and answered, a body with a blank line in it does not hold back the
requests pipelined after it, and a streamed body past `[api] max_body_bytes` gets the same 413 as one
whose Content-Length says so.

Every read has a socket timeout far above the time an answer takes, far below `request_timeout_s`."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_hostile_clients import serve

pytestmark = pytest.mark.e2e

PARK = "/groups/g/members/m/park"  # FastAPI reads and validates its body (no fast path of its own)
PATIENCE_S = 60  # how long a client waits for an answer; the guard's timeout is far longer
GUARD_TIMEOUT_S = 600  # `request_timeout_s`: an answer that waits for it is a stall
GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def _park_body(records: int) -> bytes:
    """A park request of `records` records (past the route's 10,000 it is a 422, still read whole)."""
    refs = [{"topic": "t", "partition": 0, "offset": i} for i in range(records)]
    return json.dumps({"generation": 0, "records": refs, "reason": "r"}).encode()


def _responses(sock: socket.socket, count: int) -> list[tuple[int, bytes]]:
    """Read `count` HTTP/1.1 responses framed by Content-Length: (status, body) each."""
    buffer = b""
    answers: list[tuple[int, bytes]] = []
    while len(answers) < count:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            head = buffer[:end].decode("latin-1").split("\r\n")
            fields = dict(line.lower().split(": ", 1) for line in head[1:])
            length = int(fields["content-length"])
            if len(buffer) >= end + 4 + length:
                answers.append((int(head[0].split()[1]), buffer[end + 4 : end + 4 + length]))
                buffer = buffer[end + 4 + length :]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"closed after {len(answers)} of {count} responses: {answers}"
        buffer += chunk
    return answers


@pytest.fixture
def api(db: str, tmp_path: Path, http: str) -> Iterator[str]:
    """A served API with a guard timeout no answer should wait for."""
    with serve(db, tmp_path, f"request_timeout_s = {GUARD_TIMEOUT_S}", http=http) as server:
        yield server.base


@pytest.mark.parametrize("records", [10_000, 12_000])
def test_a_large_body_is_read_whole_and_answered(api: str, records: int) -> None:
    body = _park_body(records)
    assert 400_000 < len(body) < 1_048_576  # below `max_body_bytes`: the route reads all of it
    with httpx.Client(base_url=api, timeout=PATIENCE_S) as client:
        for _ in range(3):  # on one connection, one after the other
            got = client.post(PARK, content=body, headers={"content-type": "application/json"})
            assert got.status_code in (404, 409, 422), got.text  # no such group, or too many records
            assert client.get("/healthz").status_code == 200


def test_a_blank_line_in_a_body_does_not_hold_back_the_next_request(api: str) -> None:
    body = b'{"type": "open",\r\n\r\n"data": {"owner": "ada"}}\r\n\r\n'  # JSON whitespace

    def post(path: bytes, *, chunked: bool = False) -> bytes:
        framing = b"transfer-encoding: chunked" if chunked else b"content-length: %d" % len(body)
        sent = b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body) if chunked else body
        return b"POST %b HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n%b\r\n\r\n%b" % (path, framing, sent)

    get = GET
    host, port = api.removeprefix("http://").split(":")
    statuses = []
    with socket.create_connection((host, int(port)), timeout=PATIENCE_S) as sock:
        for sent, answers in [
            (post(b"/healthz") + get, 2),  # 405: the app does not read that body
            (post(b"/commands/account/acc-1") + get, 2),
            (post(b"/commands/account/acc-2", chunked=True) + get, 2),
            (get, 1),  # after the answers: the connection still reads
        ]:
            sock.sendall(sent)
            statuses += [status for status, _ in _responses(sock, answers)]
    assert statuses == [405, 200, 200, 200, 200, 200, 200]


def test_a_streamed_body_past_the_limit_gets_413_as_a_declared_one(db: str, tmp_path: Path, http: str) -> None:
    body = _park_body(3000)  # ≈ 130 KB
    with (
        serve(db, tmp_path, "max_body_bytes = 65536", http=http) as server,
        httpx.Client(base_url=server.base, timeout=PATIENCE_S) as client,
    ):
        streamed = client.post(
            PARK,
            content=iter([body[i : i + 8192] for i in range(0, len(body), 8192)]),
            headers={"content-type": "application/json"},
        )
        declared = client.post(PARK, content=body, headers={"content-type": "application/json"})
        assert client.get("/healthz").status_code == 200
        with server.connect(timeout=PATIENCE_S) as sock:  # refused by its Content-Length, a GET pipelined after it
            head = b"POST %b HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            sock.sendall(head % (PARK.encode(), len(body)) + body + GET)
            pipelined = [status for status, _ in _responses(sock, 2)]
    assert pipelined == [413, 200]
    assert declared.status_code == 413, declared.text
    assert (streamed.status_code, streamed.json()) == (413, declared.json())
    assert streamed.headers["content-type"] == declared.headers["content-type"]
