"""The service database's migrations, run down and up again on a real database: the revision ids
databases store lead to the head, and the copied column type makes the same `xid8` column."""

from __future__ import annotations

import psycopg
import pytest
from alembic import command
from alembic.config import Config

from tests.pg import REPO_ROOT
from tributary.eventstore.migrate import head_revision, run_migrations

pytestmark = pytest.mark.integration


def _config(dsn: str) -> Config:
    cfg = Config(str(REPO_ROOT / "migrations" / "alembic.ini"))
    cfg.attributes["dsn"] = dsn
    return cfg


def _state(dsn: str) -> tuple[str | None, str | None]:
    """(the stored revision id, the type of `events.transaction_id` or None)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT version_num FROM eventstore.alembic_version").fetchone()
        col = conn.execute(
            "SELECT data_type FROM information_schema.columns "
            "WHERE table_schema = 'eventstore' AND table_name = 'events' AND column_name = 'transaction_id'"
        ).fetchone()
    return (row[0] if row else None), (col[0] if col else None)


def test_down_to_each_stored_revision_and_up_to_head(fresh_db: str) -> None:
    assert run_migrations(fresh_db) == head_revision() == "0009_removed_at"
    assert _state(fresh_db) == ("0009_removed_at", "xid8")
    command.downgrade(_config(fresh_db), "0004_sinks")
    assert _state(fresh_db) == ("0004_sinks", "xid8")
    command.downgrade(_config(fresh_db), "0003_consumer_groups")
    assert _state(fresh_db) == ("0003_consumer_groups", "xid8")
    command.downgrade(_config(fresh_db), "0002")
    assert _state(fresh_db) == ("0002", None)
    command.upgrade(_config(fresh_db), "0003_es_xact")
    assert _state(fresh_db) == ("0003_es_xact", "xid8")
    assert run_migrations(fresh_db) == "0009_removed_at"
    assert _state(fresh_db) == ("0009_removed_at", "xid8")
