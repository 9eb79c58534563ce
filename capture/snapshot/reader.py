"""`SnapshotReader`: one table's rows, read inside an exported snapshot, as COPY text, server-made JSON or rows.

`CREATE_REPLICATION_SLOT … EXPORT_SNAPSHOT` names a snapshot that sees exactly the rows committed
before the slot's consistent point; a REPEATABLE READ transaction that imports it (before the
replication connection runs its next command) reads them, and the stream carries everything after.
Rows come out of `COPY … TO STDOUT` as PostgreSQL text, the same text wal2json would print.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
from psycopg import pq, sql

from tributary.capture import compiled
from tributary.capture.database.catalog import TableInfo
from tributary.capture.database.replication import connect_options, translate_connect_error
from tributary.capture.database.session_guard import client_params, guard
from tributary.capture.decoding.values import copy_unescape, type_family
from tributary.capture.errors import TransientSourceError

__all__ = ["CHUNK_BYTES", "JSON_BATCH", "SnapshotReader", "take_copy_python"]

JSON_BATCH = 2_000  # rows per batch from json_rows
CHUNK_BYTES = 2 << 20  # COPY text per chunk of the columnar snapshot (bigger chunks: more page faults for
# the bigger arrays, and a higher peak RSS)


_ROW, _KEY = "__tributary_row", "__tributary_key"  # subquery aliases in json_rows
_CHUNK_HEAD = b"-\n"  # each text chunk's first line (columnar._DUMMY)


def take_copy_python(get_copy_data: Callable[[int], tuple[int, Any]], buf: bytearray, limit: int) -> int:
    """COPY rows from libpq (psycopg's non-blocking `get_copy_data`) onto `buf` while it is shorter
    than `limit`: 1 when it reached `limit`, else the first n <= 0 (0: nothing buffered, -1: the
    COPY ended, -2: it failed). The reference of capture/_hotpath.pyx `take_copy`."""
    while len(buf) < limit:
        nbytes, data = get_copy_data(1)
        if nbytes <= 0:
            return nbytes
        buf += data  # a copy frees libpq's buffer at once
    return 1


def _copy_columns(table: TableInfo, *, ordered: bool = False, where: sql.Composable | None = None) -> sql.Composed:
    """`COPY` of the table's columns (in `table.columns` order) as text; `ordered`: by primary key;
    `where`: a condition on the table's rows (a chunked snapshot's key range)."""
    cols = sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns)
    order: sql.Composable = sql.SQL("")
    if where is not None:
        order = sql.SQL(" WHERE ") + where
    if ordered and table.primary_key:
        order += sql.SQL(" ORDER BY ") + sql.SQL(", ").join(sql.Identifier(k) for k in table.primary_key)
    return sql.SQL("COPY (SELECT {} FROM {}.{}{}) TO STDOUT").format(
        cols, sql.Identifier(table.schema), sql.Identifier(table.table), order
    )


def _json_expr(name: str, type_name: str) -> sql.Composable | None:
    """The SQL whose `row_to_json` spelling equals capture.values' conversion of the column's text."""
    col = sql.Identifier(name)
    text = sql.SQL("({}::text)").format(col)
    fam = type_family(type_name)
    if fam in ("int", "bool", "json"):
        return col  # bare numbers, true/false, the JSON text embedded verbatim (jsonb: its text form)
    if fam in ("text", "numeric"):
        return text
    if fam == "tstz":
        return sql.SQL(
            "CASE WHEN {t} IN ('infinity', '-infinity') OR {t} LIKE '% BC' THEN {t} "
            "ELSE regexp_replace(regexp_replace({t}, ' ', 'T'), '\\+00(:00)?$', 'Z') END"
        ).format(t=text)
    if fam == "ts":
        return sql.SQL(
            "CASE WHEN {t} IN ('infinity', '-infinity') OR {t} LIKE '% BC' THEN {t} "
            "ELSE regexp_replace({t}, ' ', 'T') END"
        ).format(t=text)
    if fam == "bytea":
        return sql.SQL("CASE WHEN left({t}, 2) = '\\x' THEN substr({t}, 3) ELSE {t} END").format(t=text)
    return None  # float (shortest-repr differs), arrays (element conversions): the Python path


class SnapshotReader:
    """One read-only REPEATABLE READ transaction pinned to an exported snapshot (or, without
    `snapshot_name`, read-only REPEATABLE READ transactions of its own: a chunked snapshot's)."""

    def __init__(self, dsn: str, snapshot_name: str | None, *, label: str) -> None:
        self.label = label
        try:
            self._conn: psycopg.Connection[Any] = psycopg.connect(
                dsn, connect_timeout=10, **connect_options(), **client_params()
            )
            guard(self._conn, statement_timeout_ms=None)  # a COPY may run long (capture/database/session_guard.py)
        except psycopg.OperationalError as exc:
            raise translate_connect_error(exc, f"source {label!r} (snapshot)") from None
        self._conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        self._conn.read_only = True
        if snapshot_name is not None:
            self._conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
        self.where: sql.Composable | None = None  # a condition every read adds (a chunk's key range)

    @property
    def connection(self) -> psycopg.Connection[Any]:
        return self._conn

    def rows(self, table: TableInfo, *, ordered: bool = False) -> Iterator[tuple[str | None, ...]]:
        """Every row of `table` as text values in `table.columns` order.

        `ordered`: by primary key. A CDC snapshot holds one row per key, so heap order is fine
        (and fastest); an outbox holds many rows per stream, whose order is the point."""
        try:
            with self._conn.cursor().copy(_copy_columns(table, ordered=ordered, where=self.where)) as copy:
                yield from copy.rows()
        except psycopg.OperationalError as exc:
            raise TransientSourceError(f"source {self.label!r}: snapshot of {table.qualified} broke: {exc}") from None

    def text_chunks(self, table: TableInfo, *, chunk_bytes: int = CHUNK_BYTES) -> Iterator[bytes]:
        """Every row of `table` as COPY text lines, in chunks of about `chunk_bytes`, each led by
        the line `-` (the columnar snapshot's CSV reader skips it; capture/snapshot/columnar.py).
        libpq hands COPY OUT over one row at a time: `take_copy` (typed, or its reference
        `take_copy_python`) is the one per-row step."""
        take = compiled.take_copy or take_copy_python
        limit = len(_CHUNK_HEAD) + chunk_bytes  # a chunk ends at the first row reaching `chunk_bytes`
        try:
            with self._conn.cursor().copy(_copy_columns(table, where=self.where)) as copy:
                # psycopg's `copy.read()` runs a generator and a wait per row; libpq's
                # non-blocking PQgetCopyData (psycopg.pq) does neither: rows already received
                # are taken directly, and psycopg's `read` waits when none is (0 = would block).
                get = self._conn.pgconn.get_copy_data
                read = copy.read
                buf = bytearray(_CHUNK_HEAD)
                while True:
                    nbytes = take(get, buf, limit)
                    if nbytes == 0:
                        data = read()
                        if not data:
                            nbytes = -3  # psycopg saw the end and took the result
                            break
                        buf += data
                    elif nbytes < 0:
                        break
                    if len(buf) >= limit:
                        yield bytes(buf)
                        buf = bytearray(_CHUNK_HEAD)
                if nbytes != -3:
                    self._end_copy(nbytes)
            if len(buf) > len(_CHUNK_HEAD):
                yield bytes(buf)
        except psycopg.OperationalError as exc:
            raise TransientSourceError(f"source {self.label!r}: snapshot of {table.qualified} broke: {exc}") from None

    def _end_copy(self, nbytes: int) -> None:
        """After PQgetCopyData said the COPY ended (-1) or failed (-2): take the final results,
        as psycopg's `read` would have, leaving the transaction idle for the next table."""
        pgconn = self._conn.pgconn
        error = pgconn.error_message.decode(errors="replace").strip() if nbytes == -2 else ""
        while (result := pgconn.get_result()) is not None:
            if result.status != pq.ExecStatus.COMMAND_OK and not error:
                error = (result.error_message or b"COPY failed").decode(errors="replace").strip()
        if error:
            raise psycopg.OperationalError(error)

    def json_rows(self, table: TableInfo, key: Sequence[str]) -> Iterator[list[tuple[bytes, bytes]]] | None:
        """Every row as (key JSON, `after` JSON) built by PostgreSQL, in batches of up to
        `JSON_BATCH` rows (a snapshot's hot loop runs per batch), or None when the table has a
        column whose JSON PostgreSQL would spell differently from the envelope (floats, arrays)
        or no key. The bytes equal what `SnapshotEncoder` makes from `rows()` (tests check):
        same column order, the same escaping rules, and each value converted in SQL exactly as
        capture.values converts its text."""
        names = {c.name for c in table.columns}
        if not key or not set(key) <= names or names & {_ROW, _KEY}:
            return None  # (a column named like our aliases would shadow them inside row_to_json)
        exprs = []
        for column in table.columns:
            expr = _json_expr(column.name, column.type)
            if expr is None:
                return None
            exprs.append(expr + sql.SQL(" AS ") + sql.Identifier(column.name))
        row, key_row = sql.Identifier(_ROW), sql.Identifier(_KEY)
        keys = sql.SQL(", ").join(sql.SQL("{}.{}").format(row, sql.Identifier(k)) for k in sorted(set(key)))
        query = sql.SQL(
            "COPY (SELECT row_to_json({row}), row_to_json({key}) FROM (SELECT {exprs} FROM {schema}.{table}{where}) {row} "
            "CROSS JOIN LATERAL (SELECT {keys}) {key}) TO STDOUT"
        ).format(
            where=sql.SQL("") if self.where is None else sql.SQL(" WHERE ") + self.where,
            row=row,
            key=key_row,
            exprs=sql.SQL(", ").join(exprs),
            schema=sql.Identifier(table.schema),
            table=sql.Identifier(table.table),
            keys=keys,
        )
        return self._json_lines(table, query)

    def _json_lines(self, table: TableInfo, query: sql.Composed) -> Iterator[list[tuple[bytes, bytes]]]:
        batch: list[tuple[bytes, bytes]] = []
        add = batch.append
        try:
            with self._conn.cursor().copy(query) as copy:
                for data in copy:  # libpq hands COPY OUT over one row at a time: "after\tkey\n"
                    line = bytes(data)
                    tab = line.index(b"\t")  # COPY escaped any tab inside the JSON
                    if b"\\" in line:
                        add((copy_unescape(line[tab + 1 : -1]), copy_unescape(line[:tab])))
                    else:
                        add((line[tab + 1 : -1], line[:tab]))
                    if len(batch) == JSON_BATCH:
                        yield batch
                        batch = []
                        add = batch.append
            if batch:
                yield batch
        except psycopg.OperationalError as exc:
            raise TransientSourceError(f"source {self.label!r}: snapshot of {table.qualified} broke: {exc}") from None

    def close(self) -> None:
        if not self._conn.closed:
            self._conn.rollback()
            self._conn.close()

    def __enter__(self) -> SnapshotReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
