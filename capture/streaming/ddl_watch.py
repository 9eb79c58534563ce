"""Schema changes seen in the catalog while capture runs, told to the stream in log order.

wal2json emits no DDL (trap 5): a new shape shows only in the next change of the table, and a
rewrite (`ALTER COLUMN … TYPE … USING`, `ADD COLUMN … DEFAULT`) changes every row without one.
So each source has a *catalog watcher* (`CatalogWatcher`, a thread with its own connection) that
reads `pg_class` and `pg_attribute` once a second: every table's oid, name and relfilenode, and
for the included tables two signatures, of their columns' names and types and of the `xmin` of
each column's row (the transaction that last added, renamed, retyped or dropped it).

When a table's name or columns changed, or it was rewritten (a new relfilenode together with a
rewritten column row: VACUUM FULL or CLUSTER alone change only the relfilenode), the watcher
writes a *notice* into the WAL: `pg_logical_emit_message(true, 'tributary.ddl', …)` in a
transaction holding `ACCESS SHARE` on the table, with the table's shape read under that lock. No
DDL on the table can commit between that read and the notice's commit, so the stream reads the
notice after every change made under an older shape and before every change that the shape it
carries does not describe. Where the stream reads it (`SchemaChanges.on_notice`, on the capture
loop), it stages the table's schema record (`SourceTables.observe`: nothing when a change of the
table already announced that shape), and, as configured:

* `resnapshot_on_rewrite = true` and untouched rows now read differently: a chunked re-snapshot
  of the table is requested, as a signal would (capture/snapshot/chunked.py);
* a rename: the table under its new name is snapshotted (when that name is included), and the
  old name's topic is ended with a delete and a tombstone for each of its live keys, once the log
  commit covering the notice is made (`tick`: the keys are read back from the committed log).
  The endings still to do are committed with the log (`<source>#ddl` in the manifest's
  positions), so a crash neither loses nor repeats one.

A notice names the slot whose watcher wrote it: other sources of the same database skip it.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from psycopg import sql

from tributary.capture.database.catalog import table_info
from tributary.capture.database.source_tables import SourceTables
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.errors import CaptureError
from tributary.capture.records.routing import table_keys
from tributary.capture.records.staging import Staging
from tributary.capture.spec import SourceSpec
from tributary.capture.status import SourceStatus

__all__ = [
    "DDL_PREFIX",
    "POLL_S",
    "CatalogWatcher",
    "SchemaChanges",
    "TableShape",
    "changed",
    "ddl_key",
    "read_shapes",
]

log = logging.getLogger(__name__)

DDL_PREFIX = "tributary.ddl"
POLL_S = 1.0  # how often a watcher reads the catalog (two index scans of small catalogs)
LOCK_TIMEOUT = "5s"  # a notice waits this long for DDL in progress on its table, then tries at the next read

ColumnSpec = tuple[str, str, int]


def ddl_key(source: str) -> str:
    """The manifest positions' entry holding a source's old topics still to end (never a source name)."""
    return f"{source}#ddl"


@dataclass(frozen=True, slots=True)
class TableShape:
    """One table as the catalog shows it; the signatures for the tables watched closely (those
    included), the columns only from a full read (`read_shapes(full=True)`)."""

    oid: int
    schema: str
    table: str
    relfilenode: int
    columns_sig: str = ""  # md5 of the columns' names and types, in attnum order
    attrs_sig: str = ""  # md5 of each column's pg_attribute xmin (a column altered: a new one)
    detailed: bool = False
    columns: tuple[ColumnSpec, ...] = ()

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"


def changed(before: TableShape, after: TableShape) -> tuple[bool, bool, bool]:
    """(renamed, reshaped, restated): its name changed; its columns (name, type) changed; rows
    not changed since now read differently (a column added, dropped, renamed or retyped, or the
    table rewritten with a column rewritten: a same-type `ALTER COLUMN … TYPE … USING`)."""
    renamed = (before.schema, before.table) != (after.schema, after.table)
    if not (before.detailed and after.detailed):
        return renamed, False, False
    reshaped = before.columns_sig != after.columns_sig
    rewritten = before.relfilenode != after.relfilenode and before.attrs_sig != after.attrs_sig
    return renamed, reshaped, reshaped or rewritten


_CLASSES = """
SELECT c.oid, n.nspname, c.relname, c.relfilenode
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
"""
# One row per table, so a poll of many tables moves little: %I quotes a name holding a separator.
_SIGS = """
SELECT attrelid,
  md5(string_agg(format('%%I %%s %%s', attname, atttypid, atttypmod), ',' ORDER BY attnum)),
  md5(string_agg(xmin::text, ',' ORDER BY attnum))
FROM pg_attribute WHERE attrelid = ANY(%s) AND attnum > 0 AND NOT attisdropped GROUP BY attrelid
"""
_COLUMNS = """
SELECT attrelid, attname, format_type(atttypid, atttypmod), atttypid
FROM pg_attribute WHERE attrelid = ANY(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attrelid, attnum
"""


def read_shapes(
    conn: psycopg.Connection[Any],
    matches: Callable[[str, str], bool],
    also: Iterable[int] = (),
    *,
    full: bool = False,
) -> dict[int, TableShape]:
    """Every user table by oid; signatures for those `matches` includes and the oids in `also`
    (and, `full`, their columns)."""
    rows = conn.execute(_CLASSES).fetchall()
    extra = set(also)
    close = [int(r[0]) for r in rows if matches(r[1], r[2]) or int(r[0]) in extra]
    sigs: dict[int, tuple[str, str]] = {oid: ("", "") for oid in close}
    columns: dict[int, list[ColumnSpec]] = {oid: [] for oid in close}
    if close:
        for relid, cols, attrs in conn.execute(_SIGS, (close,)).fetchall():
            sigs[int(relid)] = (str(cols), str(attrs))
        if full:
            for relid, name, typ, typeoid in conn.execute(_COLUMNS, (close,)).fetchall():
                columns[int(relid)].append((name, typ, int(typeoid)))
    out = {}
    for oid, schema, table, node in rows:
        oid = int(oid)
        if oid in sigs:
            cols, attrs = sigs[oid]
            out[oid] = TableShape(oid, schema, table, int(node), cols, attrs, True, tuple(columns[oid]))
        else:
            out[oid] = TableShape(oid, schema, table, int(node))
    return out


_WATCHERS: weakref.WeakSet[CatalogWatcher] = weakref.WeakSet()


@atexit.register
def _join_at_exit() -> None:
    """A thread still inside libpq when the interpreter finalises crashes it: end the watchers
    first (each read takes milliseconds; a notice waits at most `LOCK_TIMEOUT` for a lock)."""
    watchers = list(_WATCHERS)
    for watcher in watchers:
        watcher.stop()
    for watcher in watchers:
        watcher.join(timeout=30)


class CatalogWatcher:
    """Reads the catalog every `interval` seconds on a thread of its own and writes a notice into
    the WAL for each included table whose name, columns or rows changed (module docstring)."""

    def __init__(self, spec: SourceSpec, matches: Callable[[str, str], bool], *, interval: float = POLL_S) -> None:
        self.spec = spec
        self.matches = matches
        self.interval = interval
        self.shapes: dict[int, TableShape] = {}
        self.notices = 0  # notices written (tests and the log)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._failing = False

    def baseline(self, conn: psycopg.Connection[Any]) -> None:
        """The shapes changes are found against: read when the stream starts."""
        self.shapes = read_shapes(conn, self.matches)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"capture-ddl-{self.spec.name}", daemon=True)
        _WATCHERS.add(self)
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end (it closes its connection), without waiting: a source that fails
        must not hold the capture loop (a connect to a host that drops packets takes 10 s). The
        process waits for it at exit (`_join_at_exit`)."""
        self._stop.set()

    def join(self, timeout: float) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        from tributary.capture.database.slot import sql_connection

        while not self._stop.wait(self.interval):
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = sql_connection(self.spec.dsn, label=self.spec.name)
                self.poll(self._conn)
                self._failing = False
            except (CaptureError, psycopg.Error) as exc:
                # The stream's own connection reports a source that is down; here it is said once.
                level = logging.DEBUG if self._failing else logging.WARNING
                log.log(
                    level, "source %s: catalog watcher: %s (tried again in %.0fs)", self.spec.name, exc, self.interval
                )
                self._failing = True
                self._close()
        self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def poll(self, conn: psycopg.Connection[Any]) -> int:
        """One read of the catalog; a notice for each table that changed. Returns how many."""
        known = self.shapes
        watched = [oid for oid, shape in known.items() if shape.detailed]
        current = read_shapes(conn, self.matches, watched)
        written = 0
        for oid, after in current.items():
            before = known.get(oid)
            if before is None:
                known[oid] = after  # a new table: its rows come through the stream
                continue
            if not any(changed(before, after)):
                if after != before:
                    known[oid] = after  # VACUUM FULL, SET DEFAULT, …: nothing rows show
                continue
            if not (self.matches(before.schema, before.table) or self.matches(after.schema, after.table)):
                known[oid] = after
                continue
            locked = self._notify(conn, before)
            if locked is not None:
                known[oid] = locked
                written += 1
        for oid in [o for o in known if o not in current]:
            del known[oid]  # dropped
        return written

    def _notify(self, conn: psycopg.Connection[Any], before: TableShape) -> TableShape | None:
        """Write the notice for a table that changed, its shape read under ACCESS SHARE (no DDL
        on it commits before the notice does). None: dropped or renamed meanwhile (next read)."""
        with conn.transaction():
            conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            row = conn.execute(
                "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.oid = %s",
                (before.oid,),
            ).fetchone()
            if row is None:
                return None
            schema, table = str(row[0]), str(row[1])
            conn.execute(
                sql.SQL("LOCK TABLE {}.{} IN ACCESS SHARE MODE").format(sql.Identifier(schema), sql.Identifier(table))
            )
            shapes = read_shapes(conn, lambda s, t: (s, t) == (schema, table), full=True)
            now = shapes.get(before.oid)
            if now is None or not now.detailed:
                return None  # renamed between the two reads: the next read sees it
            renamed, reshaped, restated = changed(before, now)
            if not (renamed or reshaped or restated):
                return now  # changed back meanwhile: nothing to tell
            info = table_info(conn, schema, table, leaves=self.spec.partitioned_tables == "leaves")
            key = info.identity_columns if info is not None else ()
            taken = False
            if renamed:
                found = conn.execute(
                    "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')",
                    (before.schema, before.table),
                ).fetchone()
                taken = found is not None
            notice = {
                "slot": self.spec.slot,
                "oid": before.oid,
                "schema": schema,
                "table": table,
                "from": [before.schema, before.table] if renamed else None,
                "from_taken": taken,
                "columns": [list(c) for c in now.columns],
                "key": list(key),
                "restated": restated,
            }
            conn.execute("SELECT pg_logical_emit_message(true, %s, %s)", (DDL_PREFIX, orjson.dumps(notice).decode()))
        self.notices += 1
        log.info(
            "source %s: schema change of %s seen in the catalog%s",
            self.spec.name,
            before.qualified,
            f" (renamed to {schema}.{table})" if renamed else "",
        )
        return now


@dataclass(frozen=True, slots=True)
class _Ending:
    """An old topic to end (a table renamed away from it), once the log holds the notice (`lsn`)."""

    schema: str
    table: str
    lsn: str  # the end of the notice's transaction

    def to_json(self) -> dict[str, str]:
        return {"schema": self.schema, "table": self.table, "lsn": self.lsn}


class SchemaChanges:
    """The stream's side of the notices: schema records, re-snapshot requests, old topics ended."""

    def __init__(
        self,
        spec: SourceSpec,
        tables: SourceTables,
        staging: Staging,
        status: SourceStatus,
        *,
        db: str,
        request: Callable[[list[str], str], None],
        restart: Callable[[str], None] = lambda name: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec
        self.clock = clock
        self.tables = tables
        self.staging = staging
        self.status = status
        self.db = db
        self.request = request  # (tables, origin): a chunked snapshot, as a signal asks for it
        self.restart = restart  # a table being snapshotted: read it again from its first key
        self.endings: list[_Ending] = []
        self.ended: list[str] = []  # topics ended (their table renamed away): nothing to warn about
        self.dirty = False  # endings changed since the last commit

    def load(self, positions: Mapping[str, str]) -> None:
        """The endings a previous run committed and had not done yet."""
        text = positions.get(ddl_key(self.spec.name))
        if text:
            doc = orjson.loads(text)
            self.endings = [_Ending(e["schema"], e["table"], e["lsn"]) for e in doc.get("pending") or ()]
            self.ended = [str(t) for t in doc.get("ended") or ()]

    def positions(self) -> dict[str, str]:
        """The endings to commit with the log, if they changed."""
        if not self.dirty:
            return {}
        doc = {"pending": [e.to_json() for e in self.endings], "ended": self.ended}
        return {ddl_key(self.spec.name): orjson.dumps(doc).decode()}

    def orphans(self, present: Iterable[tuple[str, str]]) -> list[str]:
        """The source's topics of included tables that no longer exist and that capture did not
        end: dropped, or renamed while capture was stopped (their rows stay in the topic)."""
        prefix = f"{self.spec.name}."
        tables = set(present)
        shared = {self.spec.topic(s, t) for s, t in tables} if self.spec.routing is not None else set()
        out = []
        for topic in sorted(self.staging.log.topics()):
            if not topic.startswith(prefix) or topic.endswith(".messages") or topic in self.ended or topic in shared:
                continue
            schema, dot, table = topic[len(prefix) :].partition(".")
            if dot and (schema, table) not in tables and self.tables.matches(schema, table):
                out.append(topic)
        return out

    def on_notice(self, content: str, *, tx_end: Lsn, now_ms: int) -> bool:
        """A notice read from the stream; True when it staged or asked for something."""
        try:
            notice = orjson.loads(content)
            if notice.get("slot") != self.spec.slot:
                return False  # another source's watcher on this database
            schema, table = str(notice["schema"]), str(notice["table"])
            columns = [(str(n), str(t), int(o)) for n, t, o in notice["columns"]]
            key = [str(k) for k in notice.get("key") or ()]
            origin = notice.get("from")
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("source %s: schema change notice ignored (%s): %.80r", self.spec.name, exc, content)
            return False
        acted = False
        name = f"{schema}.{table}"
        included = self.tables.matches(schema, table)
        if included:
            if origin is not None:  # its changes under the new name are keyed as its snapshot is
                self.tables.identity[(schema, table)] = tuple(key)
            self.tables.observe(schema, table, columns, complete=True, key=key, now_ms=now_ms)
            acted = True
        if origin is not None:
            old_schema, old_table = str(origin[0]), str(origin[1])
            old = f"{old_schema}.{old_table}"
            if included:
                self.request([name], f"the rename of {old} to {name}")
            if self.tables.matches(old_schema, old_table):
                if notice.get("from_taken"):
                    # Another table took the old name: its snapshot's key check removes the rest.
                    self.request([old], f"a new table named {old} after {old} was renamed to {name}")
                elif not any((e.schema, e.table) == (old_schema, old_table) for e in self.endings):
                    self.endings.append(_Ending(old_schema, old_table, str(tx_end)))
                    self.dirty = True
                    log.info(
                        "source %s: %s renamed to %s: its topic %s is ended (a delete per key) once this commits",
                        self.spec.name,
                        old,
                        name,
                        self.spec.topic(old_schema, old_table),
                    )
            acted = True
        elif included and notice.get("restated") and self.spec.resnapshot_on_rewrite:
            self.restart(name)  # chunks staged before the rewrite hold the old values
            self.request([name], f"a schema change that rewrote {name} (resnapshot_on_rewrite)")
            acted = True
        return acted

    def tick(self, durable: Lsn) -> bool:
        """Between source transactions: end each old topic whose notice the log now holds (a
        delete + tombstone per live key, read back from the committed log); True when staged."""
        due = [e for e in self.endings if Lsn.parse(e.lsn) <= durable]
        if not due:
            return False
        from tributary.capture.records import envelope as env
        from tributary.capture.snapshot.initial import SnapshotSource

        writer = SnapshotSource(self.spec, self.staging, self.tables, self.status, db=self.db, clock=self.clock)
        for ending in due:
            topic = self.spec.topic(ending.schema, ending.table)
            field = None if self.spec.routing is None else self.spec.routing.key_value(ending.schema, ending.table)
            live = self.staging.live_keys(topic) if topic in self.staging.log.topics() else set()
            keys = sorted(table_keys(live, field))  # a routed topic: only the renamed table's keys
            if keys:
                now_ms = int(self.clock() * 1000)
                encoder = env.SnapshotEncoder(
                    schema=ending.schema,
                    table=ending.table,
                    columns=[],
                    primary_key=[],
                    source_name=self.spec.name,
                    db=self.db,
                    lsn=durable,
                    now_ms=now_ms,
                    routing=self.spec.routing,
                )
                writer.stage_deletes(encoder, keys, now_ms, "true")
            self.staging.flush()
            log.info("source %s: topic %s ended: %d key(s) deleted", self.spec.name, topic, len(keys))
            self.endings.remove(ending)
            if topic not in self.ended:
                self.ended.append(topic)
        self.dirty = True
        return True
