"""`tributary init` for one source: check what capture needs, fix what we are allowed to, report.

Each check yields a `Finding` (ok / fixed / problem) with one line a user can act on. A source
with any problem cannot work, and init exits non-zero.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from tributary.capture.database.catalog import TableInfo, list_tables, probe_wal2json, server_facts, table_warnings
from tributary.capture.database.replication import ReplicationConnection, connect_options, translate_connect_error
from tributary.capture.decoding.encodings import refusal
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.records.envelope import toastable
from tributary.capture.records.routing import TableFilter, topic_problems
from tributary.capture.records.row_filter import compile_filter
from tributary.capture.records.service_outbox import OutboxTable
from tributary.capture.source import SourceSpec

__all__ = ["Finding", "Outcome", "SourceReport", "allow_line", "check_source"]


class Outcome(enum.StrEnum):
    OK = "ok"
    FIXED = "fixed"
    WARNING = "warning"
    PROBLEM = "problem"


@dataclass(frozen=True, slots=True)
class Finding:
    outcome: Outcome
    message: str


@dataclass
class SourceReport:
    name: str
    findings: list[Finding] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    connected: bool = False  # False: nothing but the connection could be checked

    @property
    def ok(self) -> bool:
        return all(f.outcome is not Outcome.PROBLEM for f in self.findings)

    def add(self, outcome: Outcome, message: str) -> None:
        self.findings.append(Finding(outcome, message))


def check_source(
    spec: SourceSpec,
    *,
    replica_identity_full: bool = False,
    allow_without_key: Iterable[str] = (),
    create_slot: bool = True,
    position: str | None = None,
    kafka: bool = False,
) -> SourceReport:
    """Check (and where allowed, fix) one source; never raises for a problem it can describe.
    `position`: the source's committed position in the log, if it has one (a slot made now would
    not hold the changes since then). `kafka`: the log is Kafka's, whose compaction cannot carry
    unchanged TOAST values forward."""
    report = SourceReport(spec.name)
    try:
        conn = psycopg.connect(spec.dsn, autocommit=True, connect_timeout=10, **connect_options())
    except psycopg.OperationalError as exc:
        report.add(Outcome.PROBLEM, str(translate_connect_error(exc, "cannot connect")))
        return report
    report.connected = True
    with conn:
        _check_server(conn, report)
        if report.ok:
            _check_tables(conn, spec, report, replica_identity_full, {*allow_without_key, *spec.allow_without_key})
            if kafka:
                _check_toast_on_kafka(conn, spec, report)
            for outbox in spec.outbox:
                _check_outbox(conn, spec, outbox, report)
        if report.ok and create_slot:
            _ensure_slot(conn, spec, report, None if position in (None, str(Lsn.ZERO)) else position)
    return report


def allow_line(spec: SourceSpec, *tables: str) -> str:
    """The config line that keeps `tables` allowed without a key, beside those already allowed."""
    names = sorted({*spec.allow_without_key, *tables})
    return "allow_without_key = [" + ", ".join(f'"{n}"' for n in names) + "]"


def _check_server(conn: psycopg.Connection[Any], report: SourceReport) -> None:
    facts = server_facts(conn)
    encoding = str(conn.info.parameter_status("server_encoding") or "UTF8")
    if (refused := refusal(encoding, database=str(conn.info.dbname))) is not None:
        report.add(Outcome.PROBLEM, refused)
    if facts.version_num < 100000:
        report.add(Outcome.PROBLEM, f"PostgreSQL {facts.version_num} is too old (10+ needed, 15+ tested)")
    if facts.wal_level != "logical":
        report.add(
            Outcome.PROBLEM,
            f"wal_level is {facts.wal_level!r}, must be 'logical': ALTER SYSTEM SET wal_level = logical; then restart the server",
        )
    else:
        report.add(Outcome.OK, "wal_level = logical")
    if not facts.can_replicate:
        report.add(Outcome.PROBLEM, "this role may not replicate: ALTER ROLE <role> REPLICATION (or use a superuser)")
    else:
        report.add(Outcome.OK, "role may replicate")
    if facts.wal_level == "logical" and facts.can_replicate:
        reason = probe_wal2json(conn)
        if reason is None:
            report.add(Outcome.OK, "wal2json loads as an output plugin")
        elif "may not be used as an output plugin" in reason:
            report.add(
                Outcome.PROBLEM,
                "wal2json is not in output_plugin_libraries: add it in postgresql.conf "
                "(output_plugin_libraries = 'pgoutput, test_decoding, wal2json') and reload",
            )
        elif "could not access file" in reason:
            report.add(
                Outcome.PROBLEM, "wal2json is not installed on the server: apt-get install postgresql-15-wal2json"
            )
        else:
            report.add(Outcome.PROBLEM, f"wal2json cannot be used: {reason}")


def _check_tables(
    conn: psycopg.Connection[Any], spec: SourceSpec, report: SourceReport, set_full: bool, allowed: set[str]
) -> None:
    tables = list_tables(
        conn, TableFilter(spec.include, spec.row_exclude).matches, leaves=spec.partitioned_tables == "leaves"
    )
    report.tables = [t.qualified for t in tables]
    if not tables:
        report.add(Outcome.WARNING, f"no table matches include={list(spec.include)} exclude={list(spec.exclude)}")
    unreadable = [
        t.qualified
        for t in tables
        if not conn.execute("SELECT has_table_privilege(%s, 'SELECT')", (f'"{t.schema}"."{t.table}"',)).fetchone()[0]  # type: ignore[index]  # a function's SELECT: one row
    ]
    if unreadable:
        report.add(Outcome.PROBLEM, f"no SELECT privilege on: {', '.join(unreadable)} (GRANT SELECT ON … TO <role>)")
    for table in (t for t in tables if t.loses_updates):
        name = table.qualified
        if set_full:
            conn.execute(
                sql.SQL("ALTER TABLE {}.{} REPLICA IDENTITY FULL").format(
                    sql.Identifier(table.schema), sql.Identifier(table.table)
                )
            )
            report.add(Outcome.FIXED, f"{name}: no primary key; set REPLICA IDENTITY FULL")
        elif name in allowed:
            report.add(
                Outcome.WARNING,
                f"{name}: no primary key or replica identity; its UPDATEs and DELETEs will be lost (allowed)",
            )
        else:
            report.add(
                Outcome.PROBLEM,
                f"{name}: no primary key or replica identity, so its UPDATEs and DELETEs would be silently lost; "
                f"add a primary key, run init with --replica-identity-full, or allow it: add "
                f"`{allow_line(spec, name)}` to the config's [[sources]] entry {spec.name!r}",
            )
    for table in (t for t in tables if not t.loses_updates):
        for warning in table_warnings(table):
            report.add(Outcome.WARNING, warning)
    _check_filtered_tables(conn, spec, [t for t in tables if not t.loses_updates], report, set_full)
    for table in tables:
        topic = spec.topic(table.schema, table.table)
        if topic != f"{spec.name}.{table.qualified}":  # routed, or identifiers a topic name cannot hold as they are
            report.add(Outcome.OK, f"{table.qualified} → topic {topic}")
    if spec.routing is not None:
        shapes = [(t.schema, t.table, t.identity_columns, tuple((c.name, c.type) for c in t.columns)) for t in tables]
        for problem in topic_problems(spec.routing, shapes):
            report.add(Outcome.PROBLEM, f"{problem} ([[sources.routes]] of source {spec.name!r})")
    if tables and not any(
        f.outcome is not Outcome.OK and f.message.startswith(t.qualified) for t in tables for f in report.findings
    ):
        report.add(Outcome.OK, f"{len(tables)} table(s) to capture, each with a key")


def _filter_beyond_identity(spec: SourceSpec, table: TableInfo) -> list[str]:
    """The columns a table's row filter reads that its UPDATEs' and DELETEs' old rows do not carry
    (none under REPLICA IDENTITY FULL, or when the filter reads only identity columns)."""
    if spec.rules is None or table.replica_identity == "f":
        return []
    rule = next((r for r in spec.rules.specs if r.matches(table.qualified)), None)
    if rule is None or not rule.row_filter:
        return []
    return sorted(compile_filter(rule.row_filter).columns - set(table.identity_columns))


def _check_filtered_tables(
    conn: psycopg.Connection[Any], spec: SourceSpec, tables: list[TableInfo], report: SourceReport, set_full: bool
) -> None:
    """A row filter over non-key columns needs the old row to tell where an UPDATE or DELETE moved
    a row; without REPLICA IDENTITY FULL capture errs to a delete + tombstone (docs/capture.md)."""
    for table in tables:
        beyond = _filter_beyond_identity(spec, table)
        if not beyond:
            continue
        name = table.qualified
        if set_full:
            conn.execute(
                sql.SQL("ALTER TABLE {}.{} REPLICA IDENTITY FULL").format(
                    sql.Identifier(table.schema), sql.Identifier(table.table)
                )
            )
            report.add(Outcome.FIXED, f"{name}: its row_filter reads {', '.join(beyond)}; set REPLICA IDENTITY FULL")
        else:
            report.add(
                Outcome.WARNING,
                f"{name}: its row_filter reads {', '.join(beyond)}, which the WAL's old rows lack without "
                "REPLICA IDENTITY FULL: every DELETE, and every UPDATE leaving a row outside the filter, becomes a "
                "delete + tombstone (run init with --replica-identity-full to set it)",
            )


def _check_outbox(conn: psycopg.Connection[Any], spec: SourceSpec, outbox: OutboxTable, report: SourceReport) -> None:
    """An outbox table (`[[sources.outbox]]`) exists and has every column its entry names: a
    typo found here, not at the first event."""
    schema, table = outbox.qualified
    columns = {
        row[0]
        for row in conn.execute(
            "SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped",
            (schema, table),
        )
    }
    where = f"[[sources.outbox]] of source {spec.name!r}"
    if not columns:
        report.add(Outcome.PROBLEM, f"outbox table {outbox.table} does not exist ({where})")
        return
    missing = [f"{setting} = {name!r}" for setting, name in outbox.columns() if name not in columns]
    if missing:
        report.add(Outcome.PROBLEM, f"outbox table {outbox.table} has no column for {', '.join(missing)} ({where})")
    else:
        report.add(Outcome.OK, f"{outbox.table}: its INSERTs are events on {outbox.topic}")


def _check_toast_on_kafka(conn: psycopg.Connection[Any], spec: SourceSpec, report: SourceReport) -> None:
    """Warn about tables whose UPDATEs may omit an unchanged TOASTed value: on Kafka, broker
    compaction removes the record that held it, so only REPLICA IDENTITY FULL keeps it whole."""
    names = [
        t.qualified
        for t in list_tables(
            conn, TableFilter(spec.include, spec.row_exclude).matches, leaves=spec.partitioned_tables == "leaves"
        )
        if t.replica_identity != "f" and any(toastable(c.type) for c in t.columns if c.name not in t.identity_columns)
    ]
    if names:
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        report.add(
            Outcome.WARNING,
            f'on Kafka, compaction can leave an unchanged large value only as "__tributary_unavailable__" '
            f"in {shown}: set REPLICA IDENTITY FULL on them to capture it whole (docs/kafka.md)",
        )


def _ensure_slot(conn: psycopg.Connection[Any], spec: SourceSpec, report: SourceReport, position: str | None) -> None:
    row = conn.execute(
        "SELECT plugin, database, wal_status, greatest(confirmed_flush_lsn, restart_lsn)::text"
        " FROM pg_replication_slots WHERE slot_name = %s",
        (spec.slot,),
    ).fetchone()
    ways = 'set snapshot = "when_needed" to re-snapshot, or capture into a new [log] root'
    resnapshots = spec.snapshot in ("when_needed", "always")  # capture recreates the slot itself
    if row is None and position is not None:
        # A slot made now would start after the log's position: capture must re-snapshot, not stream.
        if resnapshots:
            report.add(
                Outcome.WARNING,
                f"slot {spec.slot} is missing but capture has a position for this source ({position}): "
                f"capture re-snapshots and creates the slot (snapshot = {spec.snapshot})",
            )
        else:
            report.add(
                Outcome.PROBLEM,
                f"slot {spec.slot} is missing but capture has a position for this source ({position}): "
                f"a new slot would not hold the changes since then; {ways}",
            )
    elif row is None:
        with ReplicationConnection(spec.dsn, label=spec.name) as repl:
            info = repl.create_slot(spec.slot, export_snapshot=False)
        report.add(Outcome.FIXED, f"created replication slot {spec.slot} at {info.consistent_point}")
    elif row[0] != "wal2json" or row[1] != conn.info.dbname:
        report.add(
            Outcome.PROBLEM,
            f"slot {spec.slot} exists but is a {row[0]} slot of database {row[1]}: choose another slot name",
        )
    elif row[2] == "lost":
        report.add(
            Outcome.WARNING if resnapshots else Outcome.PROBLEM,
            f'slot {spec.slot} was invalidated (WAL it needed is gone): drop it, or set snapshot = "when_needed"',
        )
    elif position is not None and row[3] and Lsn.parse(row[3]) > Lsn.parse(position):
        report.add(
            Outcome.WARNING if resnapshots else Outcome.PROBLEM,
            f"slot {spec.slot} starts at {row[3]}, after the log's position {position}: it was recreated, and "
            + (f"capture re-snapshots (snapshot = {spec.snapshot})" if resnapshots else ways),
        )
    else:
        report.add(Outcome.OK, f"replication slot {spec.slot} exists ({row[2]})")
