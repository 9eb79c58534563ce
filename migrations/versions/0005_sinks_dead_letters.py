"""HTTP sinks: dead letters and delivery status, schema tributary_sinks.

A sink cannot write its dead letters to the log: the log has one writer, the capture daemon. They
go to the service database instead, beside the consumer groups' committed offsets, and are written
before the offsets that pass them are committed (a crash in between writes them again: the key
(sink, topic, partition, offset) makes that a no-op).

The fifth migration: its file was renamed from `0004_sinks_dead_letters.py` so that files sort in the
order they run; its revision id (stored in `eventstore.alembic_version`) stays `0004_sinks`.

Revision ID: 0004_sinks
Revises: 0003_consumer_groups
"""

from alembic import op

revision = "0004_sinks"
down_revision = "0003_consumer_groups"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE SCHEMA IF NOT EXISTS tributary_sinks")
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS tributary_sinks.dead_letters (
            sink text NOT NULL,
            topic text NOT NULL,
            partition int NOT NULL,
            "offset" bigint NOT NULL,
            timestamp_ms bigint NOT NULL,
            key text,
            value jsonb,
            headers jsonb NOT NULL DEFAULT '{}',
            error text NOT NULL,
            attempts int NOT NULL,
            failed_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (sink, topic, partition, "offset")
        )
        """
    )
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS tributary_sinks.status (
            sink text PRIMARY KEY,
            state text NOT NULL,
            delivered bigint NOT NULL DEFAULT 0,
            requests bigint NOT NULL DEFAULT 0,
            failed_attempts bigint NOT NULL DEFAULT 0,
            dead_letters bigint NOT NULL DEFAULT 0,
            last_error text,
            last_delivery_at timestamptz,
            pid int,
            updated_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS tributary_sinks.status")
    op.execute("DROP TABLE IF EXISTS tributary_sinks.dead_letters")
    op.execute("DROP SCHEMA IF EXISTS tributary_sinks")
