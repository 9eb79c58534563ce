"""Run the service database's Alembic migrations from code (`tributary init`, readiness)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from tributary.eventstore.errors import EventStoreError

__all__ = [
    "NOT_INITIALIZED",
    "NotInitializedError",
    "head_revision",
    "migrations_current",
    "require_initialized",
    "run_migrations",
    "sqlalchemy_url",
]

NOT_INITIALIZED = "the service database has no tributary schema yet (or an older one): run `tributary init`"


class NotInitializedError(EventStoreError):
    """The service database is reachable but not migrated to this version's head (an
    `EventStoreError`, so every CLI command prints it as its one line)."""


MIGRATIONS = Path(str(files("tributary.migrations")))  # a folder on disk, installed or editable


def sqlalchemy_url(dsn: str) -> str:
    """A libpq URL → SQLAlchemy's psycopg 3 dialect URL."""
    for prefix in ("postgresql://", "postgres://"):
        if dsn.startswith(prefix):
            return "postgresql+psycopg://" + dsn[len(prefix) :]
    return dsn


def _config(dsn: str) -> Config:
    cfg = Config(str(MIGRATIONS / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["dsn"] = dsn
    return cfg


def head_revision() -> str:
    return str(ScriptDirectory.from_config(_config("")).get_current_head())


def run_migrations(dsn: str) -> str:
    """Upgrade to head; returns the revision the database is at."""
    engine = create_engine(sqlalchemy_url(dsn), poolclass=pool.NullPool)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE SCHEMA IF NOT EXISTS eventstore")  # home of alembic_version
    engine.dispose()
    command.upgrade(_config(dsn), "head")
    return head_revision()


def migrations_current(dsn: str) -> bool:
    engine = create_engine(sqlalchemy_url(dsn), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            current = MigrationContext.configure(
                conn, opts={"version_table_schema": "eventstore"}
            ).get_current_revision()
    finally:
        engine.dispose()
    return current == head_revision()


def require_initialized(dsn: str) -> None:
    """Raise `NotInitializedError` (its message: `NOT_INITIALIZED`) unless the service database is
    at the migrations' head. `serve`, `capture` and `project run` share it, so a newcomer who skips
    `init` gets the same one line from each. A database that cannot be reached is not judged here:
    the caller's own connection reports that."""
    from sqlalchemy.exc import OperationalError

    try:
        current = migrations_current(dsn)
    except OperationalError:
        return
    if not current:
        raise NotInitializedError(NOT_INITIALIZED)
