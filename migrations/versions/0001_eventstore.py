"""The event store: events, command idempotency records, aggregate snapshots.

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE SCHEMA IF NOT EXISTS eventstore")
    op.execute(
        """
        CREATE TABLE eventstore.events (
            global_position bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            stream_id text NOT NULL,
            stream_type text NOT NULL,
            version bigint NOT NULL CHECK (version > 0),
            event_id uuid NOT NULL,
            type text NOT NULL,
            schema_version int NOT NULL DEFAULT 1,
            data jsonb NOT NULL,
            metadata jsonb NOT NULL DEFAULT '{}',
            occurred_at timestamptz NOT NULL DEFAULT now(),
            recorded_at timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT events_stream_version_key UNIQUE (stream_id, version),
            CONSTRAINT events_event_id_key UNIQUE (event_id)
        )
        """
    )
    op.execute("CREATE INDEX events_stream_type_position ON eventstore.events (stream_type, global_position)")
    op.execute(
        """
        CREATE TABLE eventstore.commands (
            command_id text PRIMARY KEY,
            stream_id text NOT NULL,
            request_hash text NOT NULL,
            response jsonb NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE eventstore.snapshots (
            stream_id text PRIMARY KEY,
            stream_type text NOT NULL,
            version bigint NOT NULL,
            state jsonb NOT NULL,
            state_version int NOT NULL DEFAULT 1,
            taken_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE eventstore.snapshots")
    op.execute("DROP TABLE eventstore.commands")
    op.execute("DROP TABLE eventstore.events")
