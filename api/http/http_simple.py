"""One whole, plain `GET` request read from a buffer without the HTTP parser's callbacks.

httptools calls back into Python once per request part (message begin, URL, every header, headers
complete, message complete) and uvicorn then splits the URL again: ≈ a fifth of a point lookup's
Python time on the server. A view query from an ordinary client is one small `GET` that arrives in
one read; `simple_get` reads such a request in a few bytes operations and declines (`None`)
anything it does not plainly understand (a body, a percent-escaped path, a fragment, an obsolete
line fold, odd bytes, HTTP/1.0, `Expect`, `Upgrade`, a second request in the same read), which then
goes to httptools as before. What it accepts, httptools reads the same way (tested by a property).
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["SimpleGet", "simple_get"]

# The request line of an origin-form target (RFC 3986 characters: unreserved, sub-delims, ":", "@",
# "/", "?" and "%"), header lines of a token, a colon and visible ASCII, spaces or tabs, then a blank
# line that ends the buffer (so exactly one request: a second one has no header-line form).
_REQUEST = re.compile(
    rb"GET (/[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*) HTTP/1\.1\r\n"
    rb"((?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[ \t]*(?:[\x21-\x7e][\x20-\x7e\t]*)?\r\n)*)\r\n"
)
_BLANKS = b" \t"
# Headers that change how the request is read or answered: declined, but for `Connection` without
# `upgrade` (a GET has no body: a client that sends `Content-Length` anyway is left to httptools).
_SPECIAL = frozenset((b"content-length", b"transfer-encoding", b"expect", b"upgrade", b"connection"))


class SimpleGet(NamedTuple):
    path: str  # the target's path (ASCII, no escapes)
    query: bytes  # after the first "?", as sent (empty if none)
    headers: list[tuple[bytes, bytes]]  # as uvicorn's: names lower-case, values as llhttp gives them
    keep_alive: bool  # False when the client sent `Connection: close`


def simple_get(data: bytes, prefix: bytes = b"GET /") -> SimpleGet | None:
    """`data` read as exactly one HTTP/1.1 `GET` without a body whose request line starts with
    `prefix`, or `None` (not such a request, or not plainly one: the caller's full parser decides)."""
    if not data.startswith(prefix) or (match := _REQUEST.fullmatch(data)) is None:
        return None
    path, _, query = match[1].partition(b"?")
    if b"%" in path:
        return None  # uvicorn unquotes the path: left to it
    headers = []
    keep_alive = True
    for line in match[2].split(b"\r\n")[:-1]:
        name, _, value = line.partition(b":")
        name = name.lower()
        value = value.lstrip(_BLANKS)  # as llhttp: without the blanks before it, with any after it
        if name in _SPECIAL:
            if name != b"connection":
                return None
            tokens = [t.strip(_BLANKS) for t in value.lower().split(b",")]
            if b"upgrade" in tokens:
                return None
            keep_alive = keep_alive and b"close" not in tokens
        headers.append((name, value))
    return SimpleGet(path.decode("ascii"), query, headers, keep_alive)
