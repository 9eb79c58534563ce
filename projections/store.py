"""Projection state in the service database: builds, checkpoints, per-build state, the view.

Tables live in schema `tributary_projections`, made by migration 0002 (`tributary init`):
`builds` (one row per build of a projection, with its lifecycle status), `checkpoints` (next
offset, max event time and latest truncate per topic-partition, per build) and `dead_letters`.
On a database that was never migrated the runner still creates them itself (`Store.ensure`, the
same definitions; `tributary init` adopts them later). Each build has its output table
`<schema>.<name>__v<version>_<build>` and a state table beside the checkpoints; a windowed
fold's build also a `<table>__late` table there: the records past their window's lateness.
All SQL is composed with `psycopg.sql`: names are quoted identifiers, values are bound.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg
from psycopg import sql

from tributary.projections.cdc import TOAST_PLACEHOLDER
from tributary.projections.codec import load_state
from tributary.projections.definition import Projection
from tributary.projections.engine import Late, Prior
from tributary.projections.errors import RunError
from tributary.projections.mirror import SCHEMA_UNIT, TYPED_VIEW, typed_columns

__all__ = ["META", "BuildRow", "Staged", "Store", "late_table"]

META = "tributary_projections"
TP = tuple[str, int]
Cursor = psycopg.Cursor[Any]
# everything migration 0002 makes: when present, the runner issues no DDL of its own
_PRESENT = sql.SQL(
    "SELECT to_regclass('tributary_projections.builds') IS NOT NULL "
    "AND to_regclass('tributary_projections.dead_letters') IS NOT NULL "
    "AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('tributary_projections.checkpoints') "
    "AND attname = 'truncate_offset' AND NOT attisdropped) "
    "AND to_regnamespace(%s) IS NOT NULL"
)
_STATE_COLUMNS = "unit text, state text, last text, pks text, dropped bigint, tps text"
_EMIT_COLUMNS = (
    'unit text, topic text, partition integer, "offset" bigint, idx integer, key text, value text, ts bigint'
)
_DDL = [
    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(META)),
    sql.SQL("""CREATE TABLE IF NOT EXISTS {}.builds (
        projection text NOT NULL, build integer NOT NULL, version integer NOT NULL,
        table_name text NOT NULL, status text NOT NULL, error text,
        started_at timestamptz NOT NULL DEFAULT now(), finished_at timestamptz,
        records bigint NOT NULL DEFAULT 0, current boolean NOT NULL DEFAULT false,
        PRIMARY KEY (projection, build))""").format(sql.Identifier(META)),
    sql.SQL("""CREATE TABLE IF NOT EXISTS {}.checkpoints (
        projection text NOT NULL, build integer NOT NULL, topic text NOT NULL,
        partition integer NOT NULL, next_offset bigint NOT NULL, max_event_time bigint,
        PRIMARY KEY (projection, build, topic, partition))""").format(sql.Identifier(META)),
    sql.SQL(
        "ALTER TABLE {}.checkpoints ADD COLUMN IF NOT EXISTS truncate_event_time bigint, "
        "ADD COLUMN IF NOT EXISTS truncate_offset bigint"
    ).format(sql.Identifier(META)),
    sql.SQL("""CREATE TABLE IF NOT EXISTS {}.dead_letters (
        projection text NOT NULL, build integer NOT NULL, topic text NOT NULL,
        partition integer NOT NULL, "offset" bigint NOT NULL, error text NOT NULL,
        at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (projection, build, topic, partition, "offset"))""").format(sql.Identifier(META)),
]


def _line_count(lines: str | bytes) -> int:
    """Rows in a block of whole COPY lines."""
    return lines.count(b"\n") if isinstance(lines, bytes) else lines.count("\n")


@dataclass(frozen=True, slots=True)
class Staged:
    """Where a run's Spark tasks COPY their output: (rows, deletes, states) tables in META."""

    columns: tuple[str, ...]
    primary_key: tuple[str, ...]
    names: tuple[str, str, str]
    emits: str | None = None  # a projection that emits: its records (`engine.Emitted`, with the unit)
    schema: str = META  # `pg_temp`: the session's temporary tables (`staging(temp=True)`)
    kept: bool = False  # the session's tables (`session_staging`): each commit empties them, none drops them

    @property
    def tables(self) -> tuple[str, ...]:
        """Every staging table, in the order the tasks COPY into them."""
        return self.names if self.emits is None else (*self.names, self.emits)


@dataclass(frozen=True, slots=True)
class _Into:
    """The SQL a commit needs of a build's output table: its name, columns, key, and how a
    staged row `s` matches a stored row `t` and replaces it."""

    target: sql.Identifier
    cols: sql.Composable
    pkcols: sql.Composable
    match: sql.Composable
    on_conflict: sql.Composable

    @classmethod
    def of(cls, schema: str, p: Projection, b: BuildRow) -> _Into:
        pk = p.table.primary_key
        nonpk = [n for n in p.table.names if n not in pk]
        sets = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n)) for n in nonpk)
        return cls(
            target=sql.Identifier(schema, b.table_name),
            cols=sql.SQL(", ").join(map(sql.Identifier, p.table.names)),
            pkcols=sql.SQL(", ").join(map(sql.Identifier, pk)),
            match=sql.SQL(" AND ").join(sql.SQL("t.{0} = s.{0}").format(sql.Identifier(k)) for k in pk),
            on_conflict=sql.SQL("DO UPDATE SET {}").format(sets) if nonpk else sql.SQL("DO NOTHING"),
        )


def _dead_letters(b: BuildRow, summaries: Iterable[Mapping[str, Any]]) -> list[tuple[str, int, str, int, int, str]]:
    """The dead letters a pass's tasks report (`--skip-errors`): (projection, build, topic,
    partition, offset, error) rows."""
    return [
        (b.projection, b.build, t, part, off, err)
        for o in summaries
        if o.get("errors")
        for t, part, off, err in orjson.loads(o["errors"])
    ]


def late_table(table_name: str) -> sql.Identifier:
    """A windowed build's late output: the records its windows' lateness left out, and why."""
    return sql.Identifier(META, table_name + "__late")


def _create_late(table_name: str) -> sql.Composed:
    return sql.SQL(
        'CREATE TABLE IF NOT EXISTS {} (topic text NOT NULL, partition integer NOT NULL, "offset" bigint NOT NULL, '
        "window_start bigint NOT NULL, window_end bigint NOT NULL, watermark bigint NOT NULL, "
        "event_time bigint NOT NULL, reason text NOT NULL, key text, value text, "
        'PRIMARY KEY (topic, partition, "offset", window_start))'
    ).format(late_table(table_name))


@dataclass(frozen=True, slots=True)
class BuildRow:
    projection: str
    build: int
    version: int
    table_name: str
    status: str
    error: str | None
    records: int
    current: bool


class Store:
    """Driver-side access to one service database (schema for views given by config)."""

    def __init__(self, conn: psycopg.Connection[Any], *, schema: str = "views") -> None:
        self.conn = conn
        self.schema = schema

    # -- bookkeeping -----------------------------------------------------------------------

    def ensure(self) -> None:
        """Make sure the bookkeeping tables and the views schema exist. On a migrated database
        (`tributary init`) this is one catalog query; otherwise (a database never migrated, or
        migrated before 0002) the runner creates or completes them itself, idempotently."""
        row = self.conn.execute(_PRESENT, (self.schema,)).fetchone()
        if row is not None and row[0]:
            return
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(hashtext('tributary_projections_ddl'))")
            for stmt in _DDL:
                self.conn.execute(stmt)
            self.conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))

    def try_lock(self, name: str) -> bool:
        """A session-level advisory lock: one runner per projection at a time."""
        row = self.conn.execute(
            "SELECT pg_try_advisory_lock(hashtext('tributary_projection'), hashtext(%s))", (name,)
        ).fetchone()
        return bool(row and row[0])

    def locked(self, name: str) -> bool:
        """Whether a runner holds `try_lock(name)` now (any session): a build row a killed process
        left `building` is not being written, so it is not shown as under way."""
        row = self.conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND classid = hashtext('tributary_projection')::oid AND objid = hashtext(%s)::oid)",
            (name,),
        ).fetchone()
        return bool(row and row[0])

    def unlock(self, name: str) -> None:
        self.conn.execute("SELECT pg_advisory_unlock(hashtext('tributary_projection'), hashtext(%s))", (name,))

    def builds(self, name: str | None = None) -> list[BuildRow]:
        q = sql.SQL(
            "SELECT projection, build, version, table_name, status, error, records, current "
            "FROM {}.builds {} ORDER BY projection, build"
        ).format(sql.Identifier(META), sql.SQL("WHERE projection = %s" if name else ""))
        return [BuildRow(*r) for r in self.conn.execute(q, (name,) if name else ()).fetchall()]

    def current(self, name: str) -> BuildRow | None:
        return next((b for b in self.builds(name) if b.current), None)

    def new_build(self, p: Projection) -> BuildRow:
        """Register a build and create its (empty) output and state tables."""
        with self.conn.transaction():
            row = self.conn.execute(
                sql.SQL("SELECT coalesce(max(build), 0) + 1 FROM {}.builds WHERE projection = %s").format(
                    sql.Identifier(META)
                ),
                (p.name,),
            ).fetchone()
            build = int(row[0]) if row else 1
            table = f"{p.name}__v{p.version}_{build}"
            cols = [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.type)) for c in p.table.columns]
            pk = sql.SQL(", ").join(map(sql.Identifier, p.table.primary_key))
            self.conn.execute(
                sql.SQL("CREATE TABLE {} ({}, PRIMARY KEY ({}))").format(
                    sql.Identifier(self.schema, table), sql.SQL(", ").join(cols), pk
                )
            )
            self.conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (unit text PRIMARY KEY, state text, last text, "
                    "pks text NOT NULL, dropped bigint NOT NULL, tps text)"
                ).format(sql.Identifier(META, table + "__state"))
            )
            if p.window is not None:
                self.conn.execute(_create_late(table))
            self.conn.execute(
                sql.SQL(
                    "INSERT INTO {}.builds (projection, build, version, table_name, status) "
                    "VALUES (%s, %s, %s, %s, 'building')"
                ).format(sql.Identifier(META)),
                (p.name, build, p.version, table),
            )
        return BuildRow(p.name, build, p.version, table, "building", None, 0, False)

    def set_status(self, b: BuildRow, status: str, error: str | None = None) -> None:
        with self.conn.transaction():
            self.conn.execute(
                sql.SQL(
                    "UPDATE {}.builds SET status = %s, error = %s, finished_at = "
                    "CASE WHEN %s IN ('done', 'failed') THEN now() END "
                    "WHERE projection = %s AND build = %s"
                ).format(sql.Identifier(META)),
                (status, error, status, b.projection, b.build),
            )

    def _checkpoint_rows(self, b: BuildRow, *columns: str) -> list[tuple[Any, ...]]:
        """(topic, partition, *columns) of each of the build's checkpoints."""
        return self.conn.execute(
            sql.SQL("SELECT topic, partition, {} FROM {}.checkpoints WHERE projection = %s AND build = %s").format(
                sql.SQL(", ").join(map(sql.Identifier, columns)), sql.Identifier(META)
            ),
            (b.projection, b.build),
        ).fetchall()

    def checkpoints(self, b: BuildRow) -> dict[tuple[str, int], tuple[int, int | None]]:
        return {(t, p): (o, m) for t, p, o, m in self._checkpoint_rows(b, "next_offset", "max_event_time")}

    def truncate_points(self, b: BuildRow) -> dict[TP, tuple[int, int]]:
        """Per topic-partition, the latest truncate a run has seen: (event time, offset)."""
        rows = self._checkpoint_rows(b, "truncate_event_time", "truncate_offset")
        return {(t, p): (int(e), int(o)) for t, p, e, o in rows if o is not None}

    def upgrade_state(self, b: BuildRow) -> None:
        """Builds made before truncates were applied have no `tps` column (the topic-partitions
        each unit has records on): add it, filled from the one each unit's last record came from."""
        state = sql.Identifier(META, b.table_name + "__state")
        row = self.conn.execute(
            "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = 'tps' AND NOT attisdropped",
            (state.as_string(self.conn),),
        ).fetchone()
        if row is not None:
            return
        with self.conn.transaction():
            self.conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS tps text").format(state))
            self.conn.execute(
                sql.SQL(
                    "UPDATE {} SET tps = CASE WHEN last IS NULL THEN '[]' ELSE "
                    "jsonb_build_array(jsonb_build_array(last::jsonb -> 1, last::jsonb -> 2))::text END"
                ).format(state)
            )

    def priors(self, b: BuildRow, units: Sequence[str]) -> dict[str, Prior]:
        """Stored state of the given units (those never seen are absent)."""
        if not units:
            return {}
        q = sql.SQL("SELECT unit, state, last, pks, dropped, tps FROM {} WHERE unit = ANY(%s)").format(
            sql.Identifier(META, b.table_name + "__state")
        )
        out: dict[str, Prior] = {}
        for unit, state, last, pks, dropped, tps in self.conn.execute(q, (list(units),)):
            out[unit] = Prior(
                state,
                None if last is None else tuple(orjson.loads(last)),
                tuple(tuple(k) for k in orjson.loads(pks)),
                int(dropped),
                False,
                () if tps is None else tuple((t, int(p)) for t, p in orjson.loads(tps)),
            )
        return out

    def units(self, b: BuildRow) -> list[str]:
        """Every unit the build's state table holds (a run that recomputes them all)."""
        q = sql.SQL("SELECT unit FROM {}").format(sql.Identifier(META, b.table_name + "__state"))
        return [r[0] for r in self.conn.execute(q)]

    def holders(self, b: BuildRow, tps: Iterable[TP]) -> list[tuple[str, str, int]]:
        """(unit, topic, partition) for each stored unit with records on one of `tps`: the units a
        truncate on that topic-partition reaches, touched by the run or not."""
        wanted = sorted(set(tps))
        if not wanted:
            return []
        state = sql.Identifier(META, b.table_name + "__state")
        q = sql.SQL(
            "SELECT unit, t.e ->> 0, (t.e ->> 1)::int FROM {}, jsonb_array_elements(tps::jsonb) AS t(e) WHERE {}"
        )
        match = sql.SQL(" OR ").join(sql.SQL("t.e = %s::jsonb") for _ in wanted)
        args = [orjson.dumps(list(tp)).decode() for tp in wanted]
        return [(u, t, int(p)) for u, t, p in self.conn.execute(q.format(state, match), args)]

    # -- the commits: a pass's output and its checkpoints in one transaction -------------------

    def commit_folds(
        self,
        p: Projection,
        b: BuildRow,
        staged: Staged,
        summaries: Sequence[Mapping[str, Any]],
        checkpoints: Mapping[TP, tuple[int, int | None]],
        records: int,
        *,
        truncates: Mapping[TP, tuple[int, int]],
        late: Sequence[Late] = (),
    ) -> int:
        """Commit a fold projection's pass, atomically: its Spark tasks COPYed rows, deleted keys
        and unit states into `staged` (each task's `summaries` row counts its rows and lists its
        dead letters). Returns rows upserted. `truncates`: each topic-partition's latest truncate
        point, stored with its checkpoint. `late`: the pass's records past their window's
        lateness, kept in the build's late table (once per record and window: a rerun adds none).

        1. check that each staged row belongs to one unit; 2. delete the rows units gave up;
        3. merge the staged rows; 4. upsert unit states; 5. move checkpoints, add dead letters and
        the records read; 6. drop the staging tables; 7. commit — all or nothing."""
        into = _Into.of(self.schema, p, b)
        rows_t, del_t, state_t = (sql.Identifier(staged.schema, n) for n in staged.names)
        with self.conn.transaction():
            cur = self.conn.cursor()
            self._check_one_row_per_key(cur, p, into, rows_t)
            cur.execute(sql.SQL("DELETE FROM {} t USING {} s WHERE {}").format(into.target, del_t, into.match))
            self._merge_rows(cur, into, rows_t)
            self._upsert_states(cur, b, state_t)
            self._advance(cur, b, checkpoints, records, truncates, _dead_letters(b, summaries))
            self._keep_late(cur, b, late)
            for t in () if staged.kept else (rows_t, del_t, state_t):  # the staging tables go with the commit
                cur.execute(sql.SQL("DROP TABLE {}").format(t))
            if staged.emits is not None:
                cur.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(staged.schema, staged.emits)))
            self._show_schema_change(p, b)
        return sum(int(o.get("rows") or 0) for o in summaries)

    def replace_rows(
        self,
        p: Projection,
        b: BuildRow,
        rows: Iterable[str | bytes],
        checkpoints: Mapping[TP, tuple[int, int | None]],
        records: int,
        *,
        distinct_keys: bool,
    ) -> int:
        """Commit a DataFrame projection's pass, atomically: the build's table becomes exactly
        `rows` (blocks of whole COPY lines, made on the driver). Returns rows written.
        `distinct_keys`: no two rows share a primary key, so that an empty table (a rebuild's
        first pass) can take them by COPY alone.

        1. COPY the rows: straight into an empty table (a new build's with its primary key added
        after the COPY: `_copy_then_key`), else into a staging table, then check
        that each key is one row's, delete every row not staged and merge the staged rows;
        2. move checkpoints and add the records read; 3. commit — all or nothing."""
        into = _Into.of(self.schema, p, b)
        with self.conn.transaction():
            cur = self.conn.cursor()
            if distinct_keys and self._empty(cur, into.target):
                if self._serving(cur, b):
                    n_rows = self._copy_rows(cur, into.target, into.cols, rows)
                else:
                    n_rows = self._copy_then_key(cur, into, rows)
            else:
                stage = sql.Identifier("_stage")
                n_rows = self._temp_stage(cur, into, stage, rows)
                self._check_one_row_per_key(cur, p, into, stage)
                cur.execute(
                    sql.SQL("DELETE FROM {} t WHERE NOT EXISTS (SELECT 1 FROM {} s WHERE {})").format(
                        into.target, stage, into.match
                    )
                )
                self._merge_rows(cur, into, stage)
            self._advance(cur, b, checkpoints, records, {}, [])
            self._show_schema_change(p, b)
        return n_rows

    def merge_rows(
        self,
        p: Projection,
        b: BuildRow,
        rows: Iterable[str | bytes],
        checkpoints: Mapping[TP, tuple[int, int | None]],
        records: int,
    ) -> int:
        """Commit an incremental DataFrame pass, atomically: `rows` are the new records' partial
        aggregates, one per key; each merges into the stored row of its key by the projection's
        `merge` (`incremental.merge_expression`), or becomes the key's row. Returns rows merged.

        1. COPY the partials into a staging table; 2. refuse two partials for one key (they would
        both be merged); 3. UPDATE the stored keys, INSERT the others; 4. move checkpoints and add
        the records read; 5. commit — all or nothing: a rerun after a crash merges them once."""
        from tributary.projections.incremental import merge_expression

        into = _Into.of(self.schema, p, b)
        stage = sql.Identifier("_partials")
        new_match = sql.SQL(" AND ").join(
            sql.SQL("old.{0} = new.{0}").format(sql.Identifier(k)) for k in p.table.primary_key
        )
        sets = sql.SQL(", ").join(
            sql.SQL("{} = {}").format(sql.Identifier(c), merge_expression(c, how)) for c, how in p.merge.items()
        )
        with self.conn.transaction():
            cur = self.conn.cursor()
            n_rows = self._temp_stage(cur, into, stage, rows)
            twice = cur.execute(
                sql.SQL("SELECT {} FROM {} GROUP BY {} HAVING count(*) > 1 LIMIT 1").format(
                    into.pkcols, stage, into.pkcols
                )
            ).fetchone()
            if twice is not None:
                raise RunError(
                    f"projection {p.name!r}: its build returned two rows for primary key {tuple(twice)}; "
                    "with merge= it must return one partial aggregate per key (group by the key)"
                )
            cur.execute(
                sql.SQL("UPDATE {} AS old SET {} FROM {} AS new WHERE {}").format(into.target, sets, stage, new_match)
            )
            cur.execute(
                sql.SQL(
                    "INSERT INTO {} ({}) SELECT {} FROM {} AS new WHERE NOT EXISTS (SELECT FROM {} AS old WHERE {}) "
                    "ORDER BY {}"
                ).format(into.target, into.cols, into.cols, stage, into.target, new_match, into.pkcols)
            )
            self._advance(cur, b, checkpoints, records, {}, [])
        return n_rows

    @staticmethod
    def _check_one_row_per_key(cur: Cursor, p: Projection, into: _Into, rows_t: sql.Identifier) -> None:
        """Two units must never write one primary key (the merge would keep either at random);
        identical duplicates are retried tasks' output, which the merge removes."""
        clash = cur.execute(
            sql.SQL("SELECT {} FROM {} s GROUP BY {} HAVING count(DISTINCT s::text) > 1 LIMIT 1").format(
                into.pkcols, rows_t, into.pkcols
            )
        ).fetchone()
        if clash is not None:
            raise RunError(
                f"projection {p.name!r}: two units produced different rows with primary key "
                f"{tuple(clash)}; make the key unique per unit (e.g. include the window start)"
            )

    @staticmethod
    def _merge_rows(cur: Cursor, into: _Into, rows_t: sql.Identifier) -> None:
        """Upsert the staged rows in key order (so that concurrent readers' locks are taken in
        one order), one of each key (retried tasks stage theirs twice)."""
        cur.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT DISTINCT ON ({}) {} FROM {} ORDER BY {} ON CONFLICT ({}) {}").format(
                into.target, into.cols, into.pkcols, into.cols, rows_t, into.pkcols, into.pkcols, into.on_conflict
            )
        )

    @staticmethod
    def _upsert_states(cur: Cursor, b: BuildRow, state_t: sql.Identifier) -> None:
        """Store each folded unit's state, which the next pass resumes from."""
        cur.execute(
            sql.SQL(
                "INSERT INTO {} (unit, state, last, pks, dropped, tps) "
                "SELECT DISTINCT ON (unit) unit, state, last, pks, dropped, tps FROM {} ORDER BY unit "
                "ON CONFLICT (unit) DO UPDATE SET state = EXCLUDED.state, "
                "last = EXCLUDED.last, "
                "pks = EXCLUDED.pks, dropped = EXCLUDED.dropped, tps = EXCLUDED.tps"
            ).format(sql.Identifier(META, b.table_name + "__state"), state_t)
        )

    @staticmethod
    def _advance(
        cur: Cursor,
        b: BuildRow,
        checkpoints: Mapping[TP, tuple[int, int | None]],
        records: int,
        truncates: Mapping[TP, tuple[int, int]],
        dead: Sequence[tuple[str, int, str, int, int, str]],
    ) -> None:
        """The bookkeeping of a pass, in its output's transaction (so that a rerun after a crash
        redoes exactly the uncommitted pass): checkpoints with each topic-partition's latest
        truncate point, dead letters, and the build's count of records read."""
        cur.executemany(
            sql.SQL(
                "INSERT INTO {}.checkpoints (projection, build, topic, partition, next_offset, "
                "max_event_time, truncate_event_time, truncate_offset) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (projection, build, topic, partition) DO UPDATE SET "
                "next_offset = EXCLUDED.next_offset, max_event_time = EXCLUDED.max_event_time, "
                "truncate_event_time = EXCLUDED.truncate_event_time, truncate_offset = EXCLUDED.truncate_offset"
            ).format(sql.Identifier(META)),
            [
                (b.projection, b.build, t, part, o, m, *truncates.get((t, part), (None, None)))
                for (t, part), (o, m) in checkpoints.items()
            ],
        )
        if dead:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {}.dead_letters (projection, build, topic, partition, "
                    '"offset", error) VALUES (%s, %s, %s, %s, %s, %s) '
                    "ON CONFLICT DO NOTHING"
                ).format(sql.Identifier(META)),
                dead,
            )
        cur.execute(
            sql.SQL("UPDATE {}.builds SET records = records + %s WHERE projection = %s AND build = %s").format(
                sql.Identifier(META)
            ),
            (records, b.projection, b.build),
        )

    @staticmethod
    def _keep_late(cur: Cursor, b: BuildRow, late: Sequence[Late]) -> None:
        """Add late records to the build's late table (made here for builds older than it)."""
        if not late:
            return
        cur.execute(_create_late(b.table_name))
        cur.executemany(
            sql.SQL(
                'INSERT INTO {} (topic, partition, "offset", window_start, window_end, watermark, event_time, '
                "reason, key, value) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
            ).format(late_table(b.table_name)),
            [
                (e.topic, e.partition, e.offset, e.window_start, e.window_end, e.watermark, e.event_time)
                + (e.reason, e.key, e.value)
                for e in late
            ],
        )

    def _show_schema_change(self, p: Projection, b: BuildRow) -> None:
        """A typed mirror's view follows its table's schema at once (not only at the next swap)."""
        if p.options.get(TYPED_VIEW) and self._is_current(b):
            self._point_view(b, only_if_changed=True)

    def _is_current(self, b: BuildRow) -> bool:
        row = self.conn.execute(
            sql.SQL("SELECT current FROM {}.builds WHERE projection = %s AND build = %s").format(sql.Identifier(META)),
            (b.projection, b.build),
        ).fetchone()
        return bool(row and row[0])

    def _typed_view(self, b: BuildRow) -> tuple[sql.Composable, str] | None:
        """A mirror build's typed view: the captured table's columns typed from the latest schema
        record (kept in the state of the schema unit), then `key` and `row`; with its description
        (what the view's comment holds). None for any other build or before a schema is seen."""
        table = sql.Identifier(self.schema, b.table_name)
        shape = self.conn.execute(
            "SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
            (table.as_string(self.conn),),
        ).fetchone()
        if shape is None or shape[0] != ["key", "row"]:
            return None
        found = self.conn.execute(
            sql.SQL("SELECT state FROM {} WHERE unit = %s").format(sql.Identifier(META, b.table_name + "__state")),
            (SCHEMA_UNIT,),
        ).fetchone()
        state = load_state(found[0]) if found else None
        columns = typed_columns(state.get("row") if isinstance(state, dict) else None)
        if not columns:
            return None
        exprs = []
        for name, typ, how in columns:
            field = sql.Literal(name)
            text = sql.SQL("NULLIF(t.row ->> {}, {})").format(field, sql.Literal(TOAST_PLACEHOLDER))
            if how == "json":
                expr = sql.SQL("t.row -> {}").format(field)
            elif how == "hex":
                expr = sql.SQL("decode({}, 'hex')").format(text)
            elif how == "text":
                expr = sql.SQL("CAST(t.row ->> {} AS {})").format(field, sql.SQL(typ))
            else:
                expr = sql.SQL("CAST({} AS {})").format(text, sql.SQL(typ))
            exprs.append(sql.SQL("{} AS {}").format(expr, sql.Identifier(name)))
        query = sql.SQL("SELECT {}, t.key, t.row FROM {} t").format(sql.SQL(", ").join(exprs), table)
        about = "typed from the schema of " + ", ".join(f"{n} {t}" for n, t, _ in columns)
        return query, about

    def _point_view(self, b: BuildRow, *, only_if_changed: bool = False) -> None:
        """(Re)define `<schema>.<name>` over this build: typed for a mirror with a schema, else
        `SELECT *`. `only_if_changed`: leave a view whose comment already says this shape."""
        view = sql.Identifier(self.schema, b.projection)
        typed = self._typed_view(b)
        if only_if_changed:
            if typed is None:
                return
            now = self.conn.execute("SELECT obj_description(to_regclass(%s), 'pg_class')", (view.as_string(self.conn),))
            row = now.fetchone()
            if row is not None and row[0] == typed[1]:
                return
        query = typed[0] if typed else sql.SQL("SELECT * FROM {}").format(sql.Identifier(self.schema, b.table_name))
        self.conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(view))
        self.conn.execute(sql.SQL("CREATE VIEW {} AS {}").format(view, query))
        if typed is not None:
            self.conn.execute(sql.SQL("COMMENT ON VIEW {} IS {}").format(view, sql.Literal(typed[1])))

    @staticmethod
    def _empty(cur: Cursor, table: sql.Composable) -> bool:
        row = cur.execute(sql.SQL("SELECT NOT EXISTS (SELECT FROM {})").format(table)).fetchone()
        return row is not None and row[0] is True

    @classmethod
    def _temp_stage(cls, cur: Cursor, into: _Into, stage: sql.Identifier, rows: Iterable[str | bytes]) -> int:
        """COPY `rows` into a temporary table shaped like the build's, gone at commit; returns the
        rows written."""
        cur.execute(
            sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} LIMIT 0").format(
                stage, into.cols, into.target
            )
        )
        return cls._copy_rows(cur, stage, into.cols, rows)

    @staticmethod
    def _serving(cur: Cursor, b: BuildRow) -> bool:
        """The build is the one its view reads (readers may be looking at its table now)."""
        row = cur.execute(
            sql.SQL("SELECT current FROM {}.builds WHERE projection = %s AND build = %s").format(sql.Identifier(META)),
            (b.projection, b.build),
        ).fetchone()
        return row is None or row[0] is not False

    @classmethod
    def _copy_then_key(cls, cur: Cursor, into: _Into, rows: Iterable[str | bytes]) -> int:
        """COPY into an empty build table no reader sees yet with its primary key dropped, then
        add the key back (same name): one sorted index build instead of an index insertion per
        row. Two rows with one key make the ADD fail (UniqueViolation) as the COPY would have, and
        the transaction rolls back with the key in place."""
        found = cur.execute(
            sql.SQL("SELECT conname FROM pg_constraint WHERE conrelid = {}::regclass AND contype = 'p'").format(
                sql.Literal(into.target.as_string(cur))
            )
        ).fetchone()
        if found is None:  # no key to rebuild
            return cls._copy_rows(cur, into.target, into.cols, rows)
        name = sql.Identifier(found[0])
        cur.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(into.target, name))
        n_rows = cls._copy_rows(cur, into.target, into.cols, rows)
        cur.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} PRIMARY KEY ({})").format(into.target, name, into.pkcols))
        return n_rows

    @staticmethod
    def _copy_rows(cur: Cursor, table: sql.Composable, cols: sql.Composable, rows: Iterable[str | bytes]) -> int:
        """COPY blocks of whole COPY lines into `table`; returns the rows written."""
        n_rows = 0
        with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(table, cols)) as cp:
            for lines in rows:
                cp.write(lines)
                n_rows += _line_count(lines)
        return n_rows

    def staging(self, p: Projection, b: BuildRow, *, temp: bool = False) -> Staged:
        """Fresh UNLOGGED staging tables that Spark tasks COPY into (leftovers of a crashed run
        are dropped first). Tasks never write the build's tables: a retried task only adds
        duplicate staging rows, which the merge's DISTINCT ON removes. `temp`: this session's
        temporary tables instead, for a pass folded on this connection (no files to create and sync)."""
        staged = Staged(
            p.table.names,
            p.table.primary_key,
            (
                f"{b.table_name}__stage_rows",
                f"{b.table_name}__stage_del",
                f"{b.table_name}__stage_state",
            ),
            None if p.emit is None else f"{b.table_name}__stage_emit",
            "pg_temp" if temp else META,
        )
        kind = sql.SQL("TEMP" if temp else "UNLOGGED")
        with self.conn.transaction():
            for t in staged.names:
                self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(staged.schema, t)))
            self._create_staging(p, b, staged, sql.SQL("CREATE {} TABLE").format(kind), sql.SQL(""))
            if staged.emits is not None:
                emit_t = sql.Identifier(staged.schema, staged.emits)
                self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(emit_t))
                self.conn.execute(sql.SQL("CREATE {} TABLE {} (" + _EMIT_COLUMNS + ")").format(kind, emit_t))
        return staged

    def session_staging(self, p: Projection, b: BuildRow) -> Staged:
        """This session's temporary staging tables for a plain fold's small passes, made once per
        session and build (`CREATE … IF NOT EXISTS … ON COMMIT DELETE ROWS`): each commit empties
        them, so a pass costs its COPYs and no DDL. Call it inside the pass's transaction."""
        staged = Staged(
            p.table.names,
            p.table.primary_key,
            (f"{b.table_name}__small_rows", f"{b.table_name}__small_del", f"{b.table_name}__small_state"),
            schema="pg_temp",
            kept=True,
        )
        self._create_staging(
            p, b, staged, sql.SQL("CREATE TEMP TABLE IF NOT EXISTS"), sql.SQL(" ON COMMIT DELETE ROWS")
        )
        return staged

    def _create_staging(
        self, p: Projection, b: BuildRow, staged: Staged, create: sql.Composable, on_commit: sql.Composable
    ) -> None:
        """The rows, deletes and states staging tables of `staged`, shaped like `b`'s table:
        `create` is the statement's head (`CREATE UNLOGGED TABLE`, `CREATE TEMP TABLE IF NOT
        EXISTS`), `on_commit` its ON COMMIT clause, if any."""
        rows_t, del_t, state_t = (sql.Identifier(staged.schema, n) for n in staged.names)
        target = sql.Identifier(self.schema, b.table_name)
        cols = sql.SQL(", ").join(map(sql.Identifier, p.table.names))
        pkcols = sql.SQL(", ").join(map(sql.Identifier, p.table.primary_key))
        like = sql.SQL("{} {}{} AS SELECT {} FROM {} LIMIT 0")
        self.conn.execute(like.format(create, rows_t, on_commit, cols, target))
        self.conn.execute(like.format(create, del_t, on_commit, pkcols, target))
        self.conn.execute(sql.SQL("{} {} (" + _STATE_COLUMNS + "){}").format(create, state_t, on_commit))

    def staged_emits(self, staged: Staged) -> Iterator[tuple[str, str | None, int]]:
        """The pass's emitted records as (key, value, timestamp), in source order (topic,
        partition, offset, unit, index): what the log gets, read through a server-side cursor (a
        rebuild's stream need not fit in memory). A retried Spark task staged some twice: each
        (unit, source record, index) counts once."""
        if staged.emits is None:
            return
        q = sql.SQL(
            'SELECT key, value, ts FROM (SELECT DISTINCT ON (topic, partition, "offset", unit, idx) * FROM {} '
            'ORDER BY topic, partition, "offset", unit, idx) e ORDER BY topic, partition, "offset", unit, idx'
        ).format(sql.Identifier(staged.schema, staged.emits))
        with self.conn.transaction(), self.conn.cursor(name="tributary_staged_emits") as cur:
            cur.itersize = 10_000
            cur.execute(q)
            for k, v, ts in cur:
                yield (k, v, int(ts))

    # -- the swap ---------------------------------------------------------------------------

    def swap(self, b: BuildRow) -> list[str]:
        """Point `<schema>.<name>` at this build in one transaction; returns old builds' tables."""
        with self.conn.transaction():
            self._point_view(b)
            self.conn.execute(
                sql.SQL(
                    "UPDATE {}.builds SET current = (build = %s), "
                    "status = CASE WHEN build = %s THEN 'done' ELSE status END, "
                    "finished_at = CASE WHEN build = %s THEN now() ELSE finished_at END "
                    "WHERE projection = %s"
                ).format(sql.Identifier(META)),
                (b.build, b.build, b.build, b.projection),
            )
        return [x.table_name for x in self.builds(b.projection) if x.build != b.build]

    def drop_build(self, name: str, table: str) -> None:
        """Drop an old build's tables and bookkeeping (after the swap; waits for its readers)."""
        with self.conn.transaction():
            self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(self.schema, table)))
            self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(META, table + "__state")))
            self.conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(late_table(table)))
            for kind in ("checkpoints", "dead_letters"):
                self.conn.execute(
                    sql.SQL(
                        "DELETE FROM {}.{} WHERE projection = %s AND build IN "
                        "(SELECT build FROM {}.builds WHERE projection = %s AND table_name = %s)"
                    ).format(sql.Identifier(META), sql.Identifier(kind), sql.Identifier(META)),
                    (name, name, table),
                )
            self.conn.execute(
                sql.SQL("DELETE FROM {}.builds WHERE projection = %s AND table_name = %s").format(sql.Identifier(META)),
                (name, table),
            )

    def dead_letters(self, b: BuildRow) -> int:
        row = self.conn.execute(
            sql.SQL("SELECT count(*) FROM {}.dead_letters WHERE projection = %s AND build = %s").format(
                sql.Identifier(META)
            ),
            (b.projection, b.build),
        ).fetchone()
        return int(row[0]) if row else 0

    def dropped_total(self, b: BuildRow) -> int:
        row = self.conn.execute(
            sql.SQL("SELECT coalesce(sum(dropped), 0) FROM {}").format(sql.Identifier(META, b.table_name + "__state"))
        ).fetchone()
        return int(row[0]) if row else 0
