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

# RFC 3986 characters of an origin-form target: unreserved, sub-delims, ":", "@", "/", "?" and "%"
# (escapes are left to the query's own parser; a path with one is declined: uvicorn unquotes it).
_TARGET = re.compile(rb"/[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*")
_HEADER = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*((?:[\x21-\x7e][\x20-\x7e\t]*)?)")
_TRAILING_SPACE = b" \t"
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
    if not data.startswith(prefix) or not data.endswith(b"\r\n\r\n"):
        return None
    end = len(data) - 4
    if data.find(b"\r\n\r\n", 0, end + 3) >= 0:  # a second request (pipelined) behind the first
        return None
    lines = data[:end].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1" or not _TARGET.fullmatch(target := parts[1]):
        return None
    path, _, query = target.partition(b"?")
    if b"%" in path:
        return None
    headers = []
    keep_alive = True
    for line in lines[1:]:
        match = _HEADER.fullmatch(line)
        if match is None:
            return None  # an empty name, a line fold, a control or non-ASCII byte, no colon
        name = match[1].lower()
        value = match[2]  # as llhttp: without the blanks before it, with any after it
        if name in _SPECIAL:
            if name != b"connection":
                return None
            tokens = [t.strip(_TRAILING_SPACE) for t in value.lower().split(b",")]
            if b"upgrade" in tokens:
                return None
            keep_alive = keep_alive and b"close" not in tokens
        headers.append((name, value))
    return SimpleGet(path.decode("ascii"), query, headers, keep_alive)
