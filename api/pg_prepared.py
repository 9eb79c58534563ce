"""A prepared statement run on a pooled connection below psycopg's cursor: the view fast path's query.

A cursor's `execute` + `fetchall` is most of the Python a point lookup runs on the server (the query
conversion, the prepare manager, the result bookkeeping: ≈ 60 µs of ≈ 150). Here the query is
already rendered SQL with `$n` placeholders and its parameters are text, so what is left is
libpq's own calls, psycopg's compiled `execute` generator under the connection's `wait` (the same
waiting, cancellation and lost-connection handling as a cursor's) and its compiled row loader.

Each connection prepares a statement the first time it runs its text (named by a digest of the
text, so equal texts share a name whatever cache they came from), up to `MAX_PREPARED` per
connection; beyond that the query runs unnamed. Values load as a cursor of this connection with
`adapters` would load them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from psycopg import AsyncConnection, errors, pq
from psycopg.adapt import AdaptersMap, Transformer
from psycopg.generators import execute

__all__ = ["MAX_PREPARED", "fetch"]

Row = TypeVar("Row")
MAX_PREPARED = 4096
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_ACTIVE = pq.TransactionStatus.ACTIVE
_SQLSTATE = pq.DiagnosticField.SQLSTATE
_STALE_PLAN = b"0A000"  # feature_not_supported: "cached plan must not change result type"


class _Loading:
    """What `Transformer` needs as its context: the adapters, and the connection (for encodings)."""

    __slots__ = ("adapters", "connection")

    def __init__(self, conn: AsyncConnection[Any], adapters: AdaptersMap) -> None:
        self.connection = conn
        self.adapters = adapters


class _State:
    """Per connection: the statement names prepared on it, its encoding, its row loader."""

    __slots__ = ("encoding", "prepared", "transformer")

    def __init__(self, conn: AsyncConnection[Any], adapters: AdaptersMap) -> None:
        self.prepared: set[bytes] = set()
        self.encoding = conn.info.encoding
        self.transformer = Transformer(_Loading(conn, adapters))


_STATE = "_tributary_prepared"  # the connection attribute holding its `(adapters, _State)`


def _state(conn: AsyncConnection[Any], adapters: AdaptersMap) -> _State:
    """This connection's state (kept on it: a weak dictionary's lookup is Python code, ≈ 1 µs)."""
    got: tuple[AdaptersMap, _State] | None = getattr(conn, _STATE, None)
    if got is None or got[0] is not adapters:
        got = (adapters, _State(conn, adapters))
        setattr(conn, _STATE, got)
    return got[1]


_names: dict[bytes, bytes] = {}  # statement name by text (a caller's cached text hashes once)


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


async def _prepare(conn: AsyncConnection[Any], state: _State, name: bytes, query: bytes) -> bytes:
    """Prepare `query` as `name` on `conn` (unnamed beyond `MAX_PREPARED`); the name it runs under."""
    if len(state.prepared) >= MAX_PREPARED:
        name = b""  # the unnamed statement: parsed per run
    conn.pgconn.send_prepare(name, query)
    results = await conn.wait(execute(conn.pgconn))
    _check(results[-1], _COMMAND_OK, state.encoding)
    if name:
        state.prepared.add(name)
    return name


def _check(result: pq.abc.PGresult, expected: pq.ExecStatus, encoding: str) -> None:
    if result.status != expected:
        raise errors.error_from_result(result, encoding=encoding)


async def fetch(
    conn: AsyncConnection[Any],
    query: bytes,
    params: Sequence[Any],
    adapters: AdaptersMap,
    make_row: Callable[[Sequence[Any]], Row],
) -> list[Row]:
    """The rows of `query` (SQL with `$1`… placeholders, typed by casts in the query) for `params`,
    each built by `make_row` from its loaded values. Errors raise as a cursor's would.

    The connection must be idle and in autocommit mode (a pooled connection of the API's pool); a
    cancelled call leaves it ACTIVE, which the pool then discards."""
    state = _state(conn, adapters)
    encoding = state.encoding
    values = [_encode(v, encoding) for v in params]
    pgconn = conn.pgconn
    name = _names.get(query)
    if name is None:
        if len(_names) >= MAX_PREPARED:
            _names.clear()
        name = _names[query] = b"tributary_" + hashlib.blake2b(query, digest_size=12).hexdigest().encode()
    if name not in state.prepared:
        name = await _prepare(conn, state, name, query)
    pgconn.send_query_prepared(name, values)
    results = await conn.wait(execute(pgconn))
    result = results[-1]
    if result.status != _TUPLES_OK and name and result.error_field(_SQLSTATE) == _STALE_PLAN:
        # The table behind the text was swapped for one of other columns (a projection's rebuild):
        # PostgreSQL refuses the old plan ("cached plan must not change result type"). Prepare it
        # again, once; what fails then is a real error.
        state.prepared.discard(name)
        pgconn.send_query(b"DEALLOCATE " + name)
        _check((await conn.wait(execute(pgconn)))[-1], _COMMAND_OK, encoding)
        name = await _prepare(conn, state, name, query)
        pgconn.send_query_prepared(name, values)
        result = (await conn.wait(execute(pgconn)))[-1]
    _check(result, _TUPLES_OK, encoding)
    tx = state.transformer
    tx.set_pgresult(result)
    try:
        return tx.load_rows(0, result.ntuples, make_row)
    finally:
        tx.set_pgresult(None)
