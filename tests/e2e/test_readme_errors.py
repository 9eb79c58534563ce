"""README's "Errors", run as written: each example request is sent to `tributary serve` and must get
exactly the problem details (RFC 9457) printed under it; the OpenAPI document and the limits'
answers (413, 431) have the same shape."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.pg import PgServer, fresh_database
from tests.servers import free_port, serving
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PROBLEM = "application/problem+json"
MEMBERS = {"type", "title", "status", "detail", "code"}


@dataclass(frozen=True)
class Example:
    """One request of the README and the answer it documents."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    content_type: str
    answer: dict[str, object]


def _head(lines: list[str]) -> tuple[dict[str, str], list[str]]:
    """Header lines (`Name: value`) up to the first blank line, and what follows it."""
    headers: dict[str, str] = {}
    while lines and lines[0].strip():
        name, _, value = lines.pop(0).partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers, lines[1:]


def parse(block: str) -> Example:
    """`METHOD PATH`, headers, a blank line, the body; then `HTTP/1.1 STATUS …`, headers, a blank
    line, the JSON answer."""
    request, _, response = block.partition("\nHTTP/1.1 ")
    method, path = request.splitlines()[0].split()
    headers, rest = _head(request.splitlines()[1:])
    status_line, *answer_lines = response.splitlines()
    answer_headers, answer = _head(answer_lines)
    return Example(
        method,
        path,
        headers,
        "\n".join(rest).strip().encode(),
        int(status_line.split()[0]),
        answer_headers.get("content-type", ""),
        json.loads("\n".join(answer)),
    )


def readme_examples() -> list[Example]:
    section = README.read_text().split("\n### Errors\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```http\n(.*?)^```$", section, flags=re.S | re.M)
    return [parse(b) for b in blocks]


@pytest.fixture(scope="module")
def base(pg_server: PgServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with fresh_database(pg_server) as dsn:
        yield from _serve(dsn, tmp_path_factory.mktemp("errors"))


def _serve(dsn: str, tmp: Path) -> Iterator[str]:
    run_migrations(dsn)
    port = free_port()
    config = tmp / "t.toml"
    config.write_text(
        f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{tmp / "log"}"\n'
        f"[api]\nport = {port}\nmax_body_bytes = 4096\nmax_header_bytes = 4096\n"
        '[eventstore]\nmodules = ["tributary.eventstore.examples.bank"]\n'
    )
    with serving(config, port, err_path=tmp / "serve.err") as url:
        yield url


def test_readme_documents_the_errors_it_should() -> None:
    codes = {e.answer["code"] for e in readme_examples()}
    assert {"conflict", "rejected", "invalid_request", "unknown_stream_type", "not_found"} <= codes, codes


def test_every_error_body_in_the_readme_is_what_the_server_sends(base: str) -> None:
    with httpx.Client(base_url=base, timeout=30) as client:
        opened = client.post("/commands/account/acc-1", json={"type": "open", "data": {"owner": "ada"}})
        assert opened.status_code == 200, opened.text  # the account the examples name, at version 1
        for ex in readme_examples():
            got = client.request(ex.method, ex.path, headers=ex.headers, content=ex.body)
            assert (got.status_code, got.headers["content-type"]) == (ex.status, ex.content_type), got.text
            assert got.json() == ex.answer, f"{ex.method} {ex.path}"
            assert set(ex.answer) >= MEMBERS and ex.answer["status"] == ex.status
            assert ex.answer["type"] == f"urn:tributary:problem:{ex.answer['code']}"


def test_the_limits_answer_problems_too(base: str) -> None:
    big = httpx.post(base + "/commands/account/acc-2", content=b"x" * 5000, timeout=30)
    assert big.status_code == 413 and big.headers["content-type"] == PROBLEM, big.text
    assert big.json()["code"] == "body_too_large" and big.json()["status"] == 413
    host, port = urlsplit(base).hostname, urlsplit(base).port
    with socket.create_connection((host, port), timeout=30) as sock:  # a head over max_header_bytes, in one piece
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n")
        raw = b""
        while b"}" not in raw:
            chunk = sock.recv(65536)
            assert chunk, raw
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431") and PROBLEM.encode() in head, head
    assert json.loads(body)["code"] == "headers_too_large"


def test_the_openapi_document_declares_problems(base: str) -> None:
    schema = httpx.get(base + "/openapi.json", timeout=30).json()
    errors = [
        (path, method, status, answer)
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
        for status, answer in op["responses"].items()
        if status[0] in "45"
    ]
    assert errors
    for path, method, status, answer in errors:
        assert list(answer["content"]) == [PROBLEM], (path, method, status)
    conflict = schema["paths"]["/commands/{stream_type}/{stream_id}"]["post"]["responses"]["409"]
    ref = conflict["content"][PROBLEM]["schema"]["$ref"].rsplit("/", 1)[1]
    assert {"stream", "expected", "actual", "attempts", "code"} <= set(
        schema["components"]["schemas"][ref]["properties"]
    )
    assert "HTTPValidationError" not in schema["components"]["schemas"]
