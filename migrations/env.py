"""Alembic environment: the service database's DSN comes from `-x dsn=…`, the config, or TRIBUTARY_SERVICE__DSN."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool

from tributary.eventstore.migrate import sqlalchemy_url
from tributary.eventstore.schema import SCHEMA, metadata

config = context.config
dsn = (
    context.get_x_argument(as_dictionary=True).get("dsn")
    or config.attributes.get("dsn")
    or os.environ.get("TRIBUTARY_SERVICE__DSN")
)
if not dsn:
    raise SystemExit("alembic: pass the service database as -x dsn=postgresql://…")

engine = create_engine(sqlalchemy_url(dsn), poolclass=pool.NullPool)
with engine.begin() as connection:  # the version table's schema must exist before Alembic reads it
    if connection.exec_driver_sql("SELECT to_regnamespace('eventstore')").scalar() is None:
        connection.exec_driver_sql("CREATE SCHEMA eventstore")  # (not IF NOT EXISTS: that needs CREATE on the db)
with engine.connect() as connection:
    context.configure(
        connection=connection,
        version_table="alembic_version",
        version_table_schema=SCHEMA,
        # The event store's tables are declared once (eventstore/schema.py); `alembic revision
        # --autogenerate` compares them. Other schemas (projections, views) are the runner's.
        target_metadata=metadata,
        include_schemas=True,
        include_name=lambda name, kind, parents: (
            name == SCHEMA if kind == "schema" else not (kind == "table" and name == "alembic_version")
        ),
    )
    with context.begin_transaction():
        context.run_migrations()
