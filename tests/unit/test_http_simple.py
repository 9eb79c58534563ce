"""`api.http_simple.simple_get` reads a request it accepts exactly as httptools (uvicorn's parser)
does, and declines what it does not plainly understand."""

from __future__ import annotations

from typing import Any

import httptools
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tributary.api.http.http_simple import simple_get

pytestmark = pytest.mark.unit


class _Parsed:
    """What httptools reports of a buffer, as uvicorn reads it."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn

    def on_message_begin(self) -> None:
        self.messages.append({"url": b"", "headers": [], "body": b"", "complete": False})

    def on_url(self, url: bytes) -> None:
        self.messages[-1]["url"] += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.messages[-1]["headers"].append((name.lower(), value))

    def on_headers_complete(self) -> None:
        m = self.messages[-1]
        m["method"] = self.parser.get_method()
        m["version"] = self.parser.get_http_version()
        m["keep_alive"] = self.parser.should_keep_alive()
        m["upgrade"] = self.parser.should_upgrade()

    def on_body(self, body: bytes) -> None:
        self.messages[-1]["body"] += body

    def on_message_complete(self) -> None:
        self.messages[-1]["complete"] = True


def _mostly(good: st.SearchStrategy[str], odd: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """`good` nine times in ten: most generated requests should be ones `simple_get` accepts."""
    return st.integers(0, 9).flatmap(lambda i: odd if i == 0 else good)


ODD = st.sampled_from(list('%# "<>\\^`{|}\x7f\x00\xe9') + ["%20", "%2F"])
TARGET_CHARS = _mostly(st.sampled_from(list("/?=&+abAZ09-._~!$'()*,;:@") + ["views/", "id=1"]), ODD)
TARGETS = st.lists(TARGET_CHARS, max_size=10).map(lambda parts: "/views/" + "".join(parts))
NAMES = _mostly(
    st.sampled_from(["Host", "host", "X-Request-ID", "Accept", "User-Agent", "Connection", "A!#$%&'*+-.^_`|~z"]),
    st.sampled_from(["Content-Length", "Transfer-Encoding", "Expect", "Upgrade", "X y", "", "X:Y", "Ä", "a\tb", " H"]),
)
VALUES = _mostly(
    st.sampled_from(["t", "", " padded ", "close", "keep-alive", "Keep-Alive, Close", "a\tb", "tab\t", "a b  c"]),
    st.sampled_from(["upgrade", "0", "chunked", "100-continue", "\t", "x\x01", "é", "  ", "\x7f", "a\nb", "a\rb"]),
)
HEADERS = st.lists(
    st.tuples(NAMES, _mostly(st.sampled_from([": ", ":", ":\t", ": \t "]), st.just(" : ")), VALUES), max_size=4
)
METHODS = _mostly(st.just("GET"), st.sampled_from(["POST", "get", "HEAD", "GET\t"]))
VERSIONS = _mostly(st.just("HTTP/1.1"), st.sampled_from(["HTTP/1.0", "HTTP/2.0", "http/1.1", "HTTP/1.1 "]))
TAILS = _mostly(st.just(""), st.sampled_from(["GET /views/x HTTP/1.1\r\n\r\n", "GET /", "abc", "\r\n", "\n"]))


def _request(method: str, target: str, version: str, headers: list[tuple[str, str, str]], tail: str) -> bytes:
    lines = [f"{method} {target} {version}"] + [f"{n}{sep}{v}" for n, sep, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n" + tail).encode("utf-8")


@settings(max_examples=2000)
@given(METHODS, TARGETS, VERSIONS, HEADERS, TAILS)
def test_accepted_requests_read_as_httptools_reads_them(
    method: str, target: str, version: str, headers: list[tuple[str, str, str]], tail: str
) -> None:
    data = _request(method, target, version, headers, tail)
    got = simple_get(data, b"GET /views/")
    if got is None:
        return
    parsed = _Parsed()
    parsed.parser.feed_data(data)  # raises if httptools refuses what simple_get accepted
    (message,) = parsed.messages
    assert message["complete"] and message["body"] == b"" and message["method"] == b"GET"
    assert message["version"] == "1.1" and not message["upgrade"]
    url = httptools.parse_url(message["url"])
    assert (got.path.encode(), got.query) == (url.path, url.query or b"")
    assert got.headers == message["headers"]
    assert got.keep_alive == message["keep_alive"]


def test_plain_requests_accepted() -> None:
    got = simple_get(b"GET /views/v?id=1&x=%20 HTTP/1.1\r\nHost: t\r\nX-Request-ID:  r-1 \r\n\r\n", b"GET /views/")
    assert got is not None
    assert (got.path, got.query, got.headers, got.keep_alive) == (
        "/views/v",
        b"id=1&x=%20",
        [(b"host", b"t"), (b"x-request-id", b"r-1 ")],  # trailing blanks kept, as llhttp
        True,
    )
    closing = simple_get(b"GET /views/v HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n", b"GET /views/")
    assert closing is not None and not closing.keep_alive and closing.query == b""


def test_unusual_requests_declined() -> None:
    for data in (
        b"GET /views/v HTTP/1.1\r\n\r\nGET /views/v HTTP/1.1\r\n\r\n",  # pipelined: uvicorn queues them
        b"GET /views/v HTTP/1.1\r\nHost: t\r\n",  # not whole yet
        b"GET /views/v HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",  # a body
        b"GET /views/v HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET /views/v HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
        b"GET /views/v HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        b"GET /views/v%2Fw HTTP/1.1\r\n\r\n",  # an escaped path: uvicorn unquotes it
        b"GET /views/v#f HTTP/1.1\r\n\r\n",
        b"GET /views/v HTTP/1.0\r\n\r\n",
        b"GET /views/v HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
        b"GET /views/v HTTP/1.1\r\nX: \xc3\xa9\r\n\r\n",
        b"GET  /views/v HTTP/1.1\r\n\r\n",
        b"POST /views/v HTTP/1.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n\r\n",
    ):
        assert simple_get(data, b"GET /views/") is None, data
