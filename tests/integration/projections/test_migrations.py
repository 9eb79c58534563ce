"""The projection bookkeeping tables belong to Alembic (revision 0002): a freshly migrated database
runs projections without the runner issuing DDL, and a database where the old runner made the
tables itself is adopted — rows kept, new columns added — and keeps running incrementally."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests import waiting
from tests.integration.projections.helpers import dump
from tributary.eventstore.migrate import migrations_current
from tributary.log.local import Log, TopicConfig, canonical_json
from tributary.projections.runner import RunSettings, rebuild, run

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
TOPIC = "shop.public.items"
NAME = "shop_public_items"
VIEW = f"views.{NAME}"

# what the runner ran before revision 0002 (projections/store.py `_DDL` then), verbatim
OLD_RUNNER_DDL = [
    "CREATE SCHEMA IF NOT EXISTS tributary_projections",
    """CREATE TABLE IF NOT EXISTS tributary_projections.builds (
        projection text NOT NULL, build integer NOT NULL, version integer NOT NULL,
        table_name text NOT NULL, status text NOT NULL, error text,
        started_at timestamptz NOT NULL DEFAULT now(), finished_at timestamptz,
        records bigint NOT NULL DEFAULT 0, current boolean NOT NULL DEFAULT false,
        PRIMARY KEY (projection, build))""",
    """CREATE TABLE IF NOT EXISTS tributary_projections.checkpoints (
        projection text NOT NULL, build integer NOT NULL, topic text NOT NULL,
        partition integer NOT NULL, next_offset bigint NOT NULL, max_event_time bigint,
        PRIMARY KEY (projection, build, topic, partition))""",
    """CREATE TABLE IF NOT EXISTS tributary_projections.dead_letters (
        projection text NOT NULL, build integer NOT NULL, topic text NOT NULL,
        partition integer NOT NULL, "offset" bigint NOT NULL, error text NOT NULL,
        at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (projection, build, topic, partition, "offset"))""",
    "CREATE SCHEMA IF NOT EXISTS views",
]


class Changes:
    """A CDC topic written by hand, with the model of the table it describes."""

    def __init__(self, root: Path) -> None:
        self.log = Log.open(root, writer=True, segment_bytes=4096)
        self.log.create_topic(TOPIC, TopicConfig(partitions=3))
        self.table: dict[int, dict[str, Any]] = {}
        self.ts = 1_700_000_000_000

    def _value(self, op: str, after: Any) -> bytes:
        self.ts += 1
        source = {"connector": "tributary", "name": "shop", "ts_ms": self.ts, "lsn": self.ts, "snapshot": "false"}
        return orjson.dumps({"before": None, "after": after, "op": op, "ts_ms": self.ts, "source": source})

    def upsert(self, *ids: int, note: str = "n") -> None:
        for i in ids:
            key = canonical_json({"id": i})
            row = {"id": i, "note": f"{note}{i}"}
            op = "u" if i in self.table else "c"
            self.table[i] = row
            self.log.append(TOPIC, self.log.partition_for(TOPIC, key), [(key, self._value(op, row), self.ts, None)])
        self.log.commit()

    def truncate(self) -> None:
        value = self._value("t", None)
        for part in range(3):
            self.log.append(TOPIC, part, [(None, value, self.ts, None)])
        self.table.clear()
        self.log.commit()

    def expected(self) -> dict[str, dict[str, Any]]:
        return {canonical_json({"id": i}).decode(): row for i, row in self.table.items()}


def _mirror(dsn: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        return {k: r for k, r in conn.execute(sql.SQL("SELECT key, row FROM {}").format(sql.Identifier("views", NAME)))}


def _columns(dsn: str, table: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = 'tributary_projections' "
            "AND table_name = %s ORDER BY ordinal_position",
            (table,),
        ).fetchall()
    return [r[0] for r in rows]


def _alembic_upgrade(dsn: str) -> None:
    res = waiting.run_process(
        [sys.executable, "-m", "alembic", "-c", "migrations/alembic.ini", "-x", f"dsn={dsn}", "upgrade", "head"],
        what="alembic upgrade",
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stdout + res.stderr


CHECKPOINT_COLUMNS = [
    "projection",
    "build",
    "topic",
    "partition",
    "next_offset",
    "max_event_time",
    "truncate_event_time",
    "truncate_offset",
]


def test_alembic_makes_the_tables_and_a_least_privileged_runner_uses_them(
    spark: Any, fresh_db: str, tmp_path: Path
) -> None:
    _alembic_upgrade(fresh_db)
    assert migrations_current(fresh_db)  # at head, 0002 (these tables) included
    assert _columns(fresh_db, "checkpoints") == CHECKPOINT_COLUMNS
    assert "current" in _columns(fresh_db, "builds") and "offset" in _columns(fresh_db, "dead_letters")
    # A role that may use the tables but not alter them: the runner must issue no DDL on them.
    role = f"runner_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute("CREATE SCHEMA views")
        for schema in ("tributary_projections", "views"):
            conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA {} TO {}").format(*map(sql.Identifier, (schema, role))))
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tributary_projections TO {}").format(
                sql.Identifier(role)
            )
        )
    try:
        changes = Changes(tmp_path / "log")
        changes.upsert(*range(10))
        s = RunSettings(
            dsn=make_conninfo(fresh_db, user=role),
            log_root=tmp_path / "log",
            mirror=(TOPIC,),
            spark_master="local[2]",
            shuffle_partitions=2,
        )
        run(NAME, s, spark=spark)
        changes.truncate()
        changes.upsert(3, 11, note="after")
        assert not run(NAME, s, spark=spark).rebuilt
        changes.log.close()
        assert _mirror(fresh_db) == changes.expected() and len(changes.expected()) == 2
    finally:
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_upgrade_adopts_what_the_old_runner_made(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for stmt in OLD_RUNNER_DDL:
            conn.execute(stmt)
    changes = Changes(tmp_path / "log")
    changes.upsert(*range(12))
    s = RunSettings(
        dsn=fresh_db, log_root=tmp_path / "log", mirror=(TOPIC,), spark_master="local[2]", shuffle_partitions=2
    )
    built = run(NAME, s, spark=spark)
    # ... and take back what today's runner added, so the database is exactly as the old runner
    # left it: its tables, a serving build with checkpoints, a state table without `tps`
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("ALTER TABLE tributary_projections.checkpoints DROP COLUMN truncate_event_time")
        conn.execute("ALTER TABLE tributary_projections.checkpoints DROP COLUMN truncate_offset")
        conn.execute(
            sql.SQL("ALTER TABLE {} DROP COLUMN tps").format(
                sql.Identifier("tributary_projections", built.table + "__state")
            )
        )
        before = conn.execute("SELECT * FROM tributary_projections.checkpoints ORDER BY 1, 2, 3, 4").fetchall()
        builds = conn.execute(
            "SELECT projection, build, table_name, current FROM tributary_projections.builds"
        ).fetchall()
    assert len(before) == 3 and builds == [(NAME, 1, built.table, True)]

    _alembic_upgrade(fresh_db)
    assert migrations_current(fresh_db)
    assert _columns(fresh_db, "checkpoints") == CHECKPOINT_COLUMNS
    with psycopg.connect(fresh_db) as conn:
        after = conn.execute("SELECT * FROM tributary_projections.checkpoints ORDER BY 1, 2, 3, 4").fetchall()
        assert [r[:6] for r in after] == before and all(r[6:] == (None, None) for r in after)
        assert (
            conn.execute("SELECT projection, build, table_name, current FROM tributary_projections.builds").fetchall()
            == builds
        )

    changes.upsert(2, 5, note="v2_")
    changes.truncate()
    changes.upsert(5, 20, note="after")
    done = run(NAME, s, spark=spark)
    assert not done.rebuilt and done.build == 1, "the old build carries on incrementally"
    assert _mirror(fresh_db) == changes.expected()
    incremental = dump(fresh_db, VIEW)
    rebuild(NAME, s, spark=spark)
    changes.log.close()
    assert dump(fresh_db, VIEW) == incremental
