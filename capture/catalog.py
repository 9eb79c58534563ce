"""What the source database holds: tables to capture, their keys, replica identity and size.

Read from pg_catalog with plain SQL; used by `init` (checks) and by the snapshot (what to copy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

__all__ = ["Column", "ColumnHistory", "ServerFacts", "TableInfo", "list_tables", "probe_wal2json", "server_facts"]


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str  # format_type(oid, typmod): the same spelling wal2json uses with include-typmod
    typeoid: int


@dataclass(frozen=True, slots=True)
class TableInfo:
    schema: str
    table: str
    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]
    replica_identity: str  # d(efault) n(othing) f(ull) i(ndex)
    identity_columns: tuple[str, ...]  # PK, or the REPLICA IDENTITY USING INDEX columns
    estimated_rows: int

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def loses_updates(self) -> bool:
        """Trap 4: without a key or FULL identity, wal2json silently drops UPDATE and DELETE."""
        return self.replica_identity != "f" and not self.identity_columns


_TABLES = """
SELECT n.nspname, c.relname, c.oid, c.relreplident, GREATEST(c.reltuples, 0)::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
ORDER BY 1, 2
"""
_COLUMNS = """
SELECT attrelid, attname, format_type(atttypid, atttypmod), atttypid
FROM pg_attribute WHERE attrelid = ANY(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attrelid, attnum
"""
_KEYS = """
SELECT i.indrelid, i.indisprimary, i.indisreplident, array_agg(a.attname ORDER BY k.ord)
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = ANY(%s) AND (i.indisprimary OR i.indisreplident)
GROUP BY i.indrelid, i.indexrelid, i.indisprimary, i.indisreplident
"""


def list_tables(conn: psycopg.Connection[Any], matches: Any) -> list[TableInfo]:
    """Tables for which `matches(schema, table)` is true, with columns and keys."""
    rows = [r for r in conn.execute(_TABLES).fetchall() if matches(r[0], r[1])]
    oids = [r[2] for r in rows]
    columns: dict[int, list[Column]] = {oid: [] for oid in oids}
    for relid, name, typ, typeoid in conn.execute(_COLUMNS, (oids,)).fetchall():
        columns[relid].append(Column(name, typ, typeoid))
    pks: dict[int, tuple[str, ...]] = {}
    replident_idx: dict[int, tuple[str, ...]] = {}
    for relid, is_pk, is_ri, cols in conn.execute(_KEYS, (oids,)).fetchall():
        if is_pk:
            pks[relid] = tuple(cols)
        if is_ri:
            replident_idx[relid] = tuple(cols)
    out = []
    for schema, table, oid, ident, est in rows:
        ident = ident if isinstance(ident, str) else bytes(ident).decode()
        pk = pks.get(oid, ())
        identity = replident_idx.get(oid, ()) if ident == "i" else (pk if ident == "d" else ())
        out.append(TableInfo(schema, table, tuple(columns[oid]), pk, ident, identity, int(est)))
    return out


@dataclass(frozen=True, slots=True)
class ServerFacts:
    version_num: int
    wal_level: str
    max_replication_slots: int
    max_wal_senders: int
    output_plugin_libraries: str | None  # Debian 15.18's allow-list, None where the GUC does not exist
    is_superuser: bool
    can_replicate: bool
    database: str


def server_facts(conn: psycopg.Connection[Any]) -> ServerFacts:
    def setting(name: str) -> str | None:
        row = conn.execute("SELECT setting FROM pg_settings WHERE name = %s", (name,)).fetchone()
        return None if row is None else str(row[0])

    role = conn.execute("SELECT rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user").fetchone()
    assert role is not None
    return ServerFacts(
        version_num=int(setting("server_version_num") or 0),
        wal_level=setting("wal_level") or "",
        max_replication_slots=int(setting("max_replication_slots") or 0),
        max_wal_senders=int(setting("max_wal_senders") or 0),
        output_plugin_libraries=setting("output_plugin_libraries"),
        is_superuser=bool(role[0]),
        can_replicate=bool(role[0] or role[1]),
        database=str(conn.info.dbname),
    )


def probe_wal2json(conn: psycopg.Connection[Any]) -> str | None:
    """Create and drop a temporary wal2json slot; None if it works, else the server's reason.

    wal2json is a plain shared library (no extension row), so trying it is the only real check:
    it covers the library being installed, Debian's output-plugin allow-list and the privilege.
    """
    import uuid

    name = f"tributary_probe_{uuid.uuid4().hex[:8]}"
    try:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json', true)", (name,))
        conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    except psycopg.Error as exc:
        diag = exc.diag
        hint = f" ({diag.message_hint})" if diag.message_hint else ""
        return f"{diag.message_primary or exc}{hint}"
    return None


# One statement, so the snapshot it reports is the one the attributes were read under.
_HISTORY = """
SELECT s.snap::text, a.attnum, a.attname, a.attisdropped, a.xmin::text::bigint, a.age_
FROM (SELECT txid_current_snapshot() AS snap) s
LEFT JOIN (
  SELECT attnum, attname, attisdropped, pg_attribute.xmin, age(pg_attribute.xmin) AS age_
  FROM pg_attribute JOIN pg_class c ON c.oid = attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = %s AND c.relname = %s AND attnum > 0
) a ON true
"""
_XID = 1 << 32
_ANCIENT = 1 << 30  # an attribute row older than this many transactions predates any change we read


def _precedes(a: int, b: int) -> bool:
    """PostgreSQL's TransactionIdPrecedes on 32-bit xids (modulo-2^32 arithmetic)."""
    return ((a - b) % _XID) >= (_XID >> 1)


@dataclass(slots=True)
class _TableView:
    xmin: int  # every transaction before it had ended when the attributes were read
    xmax: int  # no transaction from it on had started
    running: frozenset[int]
    attrs: dict[int, tuple[str, bool, int, bool]] = field(default_factory=dict)  # attnum: name, dropped, xmin, ancient

    def covers(self, xid: int) -> bool:
        """Had `xid` ended when the view was read (so every DDL before its changes shows)?"""
        return _precedes(xid, self.xmin) or (_precedes(xid, self.xmax) and xid not in self.running)


class ColumnHistory:
    """Did a column exist when a given transaction changed its table? Answers why an UPDATE omits it.

    wal2json decodes each change under the catalog as it was at that change, and omits a column
    that did not exist then as well as an unchanged TOAST value. pg_attribute tells the two apart:
    a column's row keeps its attnum for ever (a dropped one stays, `attisdropped`), and its xmin
    is the transaction that added, renamed, retyped, re-defaulted or dropped it. A column omitted by
    a change of transaction X existed at X when its row was last written before X and is not
    dropped; or was dropped after X; or was rewritten after X but a column with a higher attnum
    (added later: attnums only grow) already existed at X, and every name X shows is a column of
    today (no rename in between to tell it apart from). Read once per table and again only for a
    transaction the reading did not see ended; a transaction's changes reach capture after it
    committed, so one re-read suffices."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._conn: Any = None
        self._views: dict[tuple[str, str], _TableView] = {}
        self._attnums: dict[tuple[str, str], dict[str, int]] = {}  # every name each attnum was seen under
        self.reads = 0  # catalog reads so far (tests check the cache holds)

    def existed(
        self, schema: str, table: str, column: str, xid: int | None, shown: frozenset[str] = frozenset()
    ) -> bool:
        """True when `column` existed at transaction `xid`'s change of the table, which lists `shown`."""
        if xid is None:
            return True  # no transaction id to place the change: keep the old assumption (TOAST)
        view = self._views.get((schema, table))
        if view is None or not view.covers(xid):
            view = self._read(schema, table)
        attnum = self._attnums.get((schema, table), {}).get(column)
        entry = None if attnum is None else view.attrs.get(attnum)
        if entry is None:
            return False  # never a column of this table that we know of
        name, dropped, xmin, ancient = entry
        if self._before(xmin, ancient, xid):
            return not dropped and name == column
        if dropped:
            return True  # dropped after the change: it was there
        # Rewritten after the change: added then (it was not there), or altered (it was). A column
        # added later has a higher attnum; a renamed one would show a name today's catalog lacks.
        names = self._attnums[(schema, table)]
        if any(n not in names for n in shown):
            return False
        at, own = xid, attnum or 0
        return any(a > own and self._before(x, old, at) for a, (_, _, x, old) in view.attrs.items())

    @staticmethod
    def _before(xmin: int, ancient: bool, xid: int) -> bool:
        """Was the attribute row last written no later than transaction `xid` (its own DDL counts)?"""
        return ancient or xmin == xid or _precedes(xmin, xid)

    def _read(self, schema: str, table: str) -> _TableView:
        rows = self._query(schema, table)
        self.reads += 1
        snap = str(rows[0][0]).split(":")
        view = _TableView(
            int(snap[0]) % _XID, int(snap[1]) % _XID, frozenset(int(x) % _XID for x in snap[2].split(",") if x)
        )
        names = self._attnums.setdefault((schema, table), {})
        for _, attnum, name, dropped, xmin, age in rows:
            if attnum is None:
                continue
            view.attrs[attnum] = (name, bool(dropped), int(xmin) % _XID, int(age) >= _ANCIENT)
            if not dropped:
                names[name] = attnum
        self._views[(schema, table)] = view
        return view

    def _query(self, schema: str, table: str) -> list[tuple[Any, ...]]:
        for attempt in (0, 1):
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                return list(self._conn.execute(_HISTORY, (schema, table)).fetchall())
            except psycopg.OperationalError:
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
