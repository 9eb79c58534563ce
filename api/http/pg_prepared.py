"""Prepared view statements' bookkeeping, per connection: names, parameters as text, row loading.

A cursor's `execute` + `fetchall` is most of the Python a point lookup would run on the server (the
query conversion, the prepare manager, the result bookkeeping: ≈ 60 µs of ≈ 150). The views' read
path (`api.pg_pipeline`) sends already rendered SQL with `$n` placeholders and text parameters with
libpq's own calls, and loads rows with psycopg's compiled loader; this module holds what it needs.

Each connection prepares a statement the first time it runs its text (named by a digest of the
text, so equal texts share a name whatever cache they came from), up to `MAX_PREPARED` per
connection; beyond that the query runs unnamed. Values load as a cursor of this connection with
`adapters` would load them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection, errors
from psycopg.adapt import AdaptersMap, Transformer

__all__ = ["MAX_PREPARED", "State", "encode_params", "state", "statement_name"]

MAX_PREPARED = 4096


class _Loading:
    """What `Transformer` needs as its context: the adapters, and the connection (for encodings)."""

    __slots__ = ("adapters", "connection")

    def __init__(self, conn: AsyncConnection[Any], adapters: AdaptersMap) -> None:
        self.connection = conn
        self.adapters = adapters


class State:
    """Per connection: the statement names prepared on it, its encoding, its row loader."""

    __slots__ = ("encoding", "prepared", "transformer")

    def __init__(self, conn: AsyncConnection[Any], adapters: AdaptersMap) -> None:
        self.prepared: set[bytes] = set()
        self.encoding = conn.info.encoding
        self.transformer = Transformer(_Loading(conn, adapters))


_STATE = "_tributary_prepared"  # the connection attribute holding its `(adapters, State)`


def state(conn: AsyncConnection[Any], adapters: AdaptersMap) -> State:
    """This connection's state (kept on it: a weak dictionary's lookup is Python code, ≈ 1 µs)."""
    got: tuple[AdaptersMap, State] | None = getattr(conn, _STATE, None)
    if got is None or got[0] is not adapters:
        got = (adapters, State(conn, adapters))
        setattr(conn, _STATE, got)
    return got[1]


_names: dict[bytes, bytes] = {}  # statement name by text (a caller's cached text hashes once)


def statement_name(query: bytes) -> bytes:
    """The name `query` is prepared under on every connection: a digest of its text."""
    name = _names.get(query)
    if name is None:
        if len(_names) >= MAX_PREPARED:
            _names.clear()
        name = _names[query] = b"tributary_" + hashlib.blake2b(query, digest_size=12).hexdigest().encode()
    return name


def encode_params(params: Sequence[Any], encoding: str) -> list[bytes | None]:
    """The parameters as text, as psycopg would send them (NUL refused as psycopg does)."""
    return [_encode(v, encoding) for v in params]


def _encode(value: Any, encoding: str) -> bytes | None:
    """A parameter as text, as psycopg would send it; `None` is NULL."""
    if value is None:
        return None
    if isinstance(value, str):
        data = value.encode(encoding)
        if b"\x00" in data:  # libpq reads text parameters up to the first NUL: refuse, as psycopg does
            raise errors.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        return data
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, int | float):
        return repr(value).encode()
    raise TypeError(f"cannot send a {type(value).__name__} as a text parameter")
