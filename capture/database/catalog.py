"""What the source database holds: tables to capture, their keys, replica identity and size.

Read from pg_catalog with plain SQL; used by `init` (checks) and by the snapshot (what to copy).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg
from psycopg import sql
from psycopg.abc import Params

__all__ = [
    "CatalogConnection",
    "Column",
    "ColumnHistory",
    "ServerFacts",
    "TableInfo",
    "list_tables",
    "partition_roots",
    "probe_wal2json",
    "server_facts",
    "table_info",
    "table_warnings",
]


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
    # The record key's columns, one rule for snapshot, stream and checks: the primary key, else the
    # REPLICA IDENTITY USING INDEX columns; () = the whole row is the key.
    identity_columns: tuple[str, ...]
    estimated_rows: int
    index_columns: tuple[str, ...] = ()  # the REPLICA IDENTITY USING INDEX columns, if any
    partitioned: bool = False  # a partitioned table (its rows live in its partitions)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"

    @property
    def loses_updates(self) -> bool:
        """Trap 4: unless the replica identity names the old row (its primary key under DEFAULT,
        an index, or FULL), wal2json silently drops UPDATE and DELETE."""
        if self.replica_identity == "f":
            return False
        if self.replica_identity == "i":
            return not self.index_columns
        return self.replica_identity == "n" or not self.primary_key

    @property
    def key_change_unseen(self) -> bool:
        """Under REPLICA IDENTITY USING INDEX, a change of a primary-key column outside the index
        is invisible in the WAL (the old row shows only the index's columns): the old key's
        record would stay live."""
        return (
            self.replica_identity == "i"
            and bool(self.primary_key)
            and not set(self.primary_key) <= set(self.index_columns)
        )

    @property
    def whole_row_key(self) -> bool:
        """Keyed by the whole row (no primary key, no identity index): identical rows share a key."""
        return not self.identity_columns


# A partitioned table's rows are captured as the root table's (`partitioned_tables = "root"`, the
# default) or as each leaf partition's ("leaves"); the estimate of a root sums its leaves'.
def table_warnings(table: TableInfo) -> list[str]:
    """What capture cannot keep right about a table as it is (the status and `init` show them)."""
    name = table.qualified
    if table.loses_updates:
        return [f"{name} has no primary key or replica identity: its UPDATEs and DELETEs are not captured"]
    if table.key_change_unseen:
        return [
            f"{name}: its replica identity index ({', '.join(table.index_columns)}) does not cover its primary key "
            f"({', '.join(table.primary_key)}), so a changed primary-key value is not in the WAL and the old key's "
            "record stays; use REPLICA IDENTITY DEFAULT or FULL"
        ]
    if table.whole_row_key:
        return [
            f"{name} has no primary key: its records are keyed by the whole row, so identical rows share one key "
            "(deleting one of them deletes the key); add a primary key"
        ]
    return []


_TABLES = """
SELECT n.nspname, c.relname, c.oid, c.relreplident,
  CASE WHEN c.relkind = 'p' THEN (
    SELECT COALESCE(sum(GREATEST(l.reltuples, 0)), 0) FROM pg_partition_tree(c.oid) t
    JOIN pg_class l ON l.oid = t.relid WHERE t.isleaf)
  ELSE GREATEST(c.reltuples, 0) END::bigint,
  c.relkind = 'p'
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%'
  AND CASE WHEN %s THEN c.relkind = 'r' ELSE c.relkind IN ('r', 'p') AND NOT c.relispartition END
ORDER BY 1, 2
"""
_LEAVES = """
SELECT n.nspname, c.relname, rn.nspname, r.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_class r ON r.oid = pg_partition_root(c.oid) JOIN pg_namespace rn ON rn.oid = r.relnamespace
WHERE c.relispartition AND c.relkind = 'r' {where}
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


def list_tables(
    conn: psycopg.Connection[Any], matches: Callable[[str, str], bool], *, leaves: bool = False
) -> list[TableInfo]:
    """Tables for which `matches(schema, table)` is true, with columns and keys: plain tables and
    partitioned roots, or (`leaves`) plain tables and leaf partitions."""
    rows = [r for r in conn.execute(_TABLES, (leaves,)).fetchall() if matches(r[0], r[1])]
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
    for schema, table, oid, ident, est, partitioned in rows:
        ident = ident if isinstance(ident, str) else bytes(ident).decode()
        pk = pks.get(oid, ())
        index = replident_idx.get(oid, ()) if ident == "i" else ()
        key = pk or index
        out.append(TableInfo(schema, table, tuple(columns[oid]), pk, ident, key, int(est), index, bool(partitioned)))
    return out


def table_info(conn: psycopg.Connection[Any], schema: str, table: str, *, leaves: bool = False) -> TableInfo | None:
    """One table's columns and keys as `list_tables` reads them; None when it is not there (now)."""
    found = list_tables(conn, lambda s, t: (s, t) == (schema, table), leaves=leaves)
    return found[0] if found else None


def partition_roots(
    conn: psycopg.Connection[Any], names: list[tuple[str, str]] | None = None
) -> dict[tuple[str, str], tuple[str, str]]:
    """(schema, table) of each leaf partition → its root table's; only of `names` when given."""
    if names is None:
        rows = conn.execute(_LEAVES.format(where="")).fetchall()
    else:
        if not names:
            return {}
        where = "AND (n.nspname, c.relname) IN (SELECT * FROM unnest(%s::text[], %s::text[]))"
        rows = conn.execute(_LEAVES.format(where=where), ([n[0] for n in names], [n[1] for n in names])).fetchall()
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


class CatalogConnection:
    """A connection for catalog reads made while streaming: opened on first use, opened again
    once when the server dropped it (a restart between two reads)."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]]) -> None:
        self._connect = connect
        self._conn: psycopg.Connection[Any] | None = None

    def query(self, statement: LiteralString | sql.Composed, params: Params | None = None) -> list[tuple[Any, ...]]:
        for attempt in (0, 1):
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                return list(self._conn.execute(statement, params).fetchall())
            except psycopg.OperationalError:
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The open connection (opened now if needed), for helpers that take one."""
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


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

    def __init__(self, catalog: CatalogConnection) -> None:
        """`catalog`: the connection it reads through (shared with the source's other catalog reads)."""
        self._catalog = catalog
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
        return self._catalog.query(_HISTORY, (schema, table))

    def close(self) -> None:
        self._catalog.close()
