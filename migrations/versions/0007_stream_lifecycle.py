"""The event store's stream lifecycle: stream metadata (max age, max count, truncate before, user
metadata), soft and hard deletes, and where removed events stood in `$all`.

Appends only read `eventstore.streams` (by primary key); metadata writes, deletes and the scavenge
write it. See docs/eventstore.md, "Stream lifecycle".

Revision ID: 0006_stream_lifecycle
Revises: 0005_consumer_nacks
"""

from alembic import op

revision = "0006_stream_lifecycle"
down_revision = "0005_consumer_nacks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE eventstore.streams (
            stream_id text PRIMARY KEY,
            stream_type text,
            metadata_version bigint NOT NULL DEFAULT 0,
            max_age bigint CONSTRAINT streams_max_age_check CHECK (max_age > 0),
            max_count bigint CONSTRAINT streams_max_count_check CHECK (max_count > 0),
            truncate_before bigint CONSTRAINT streams_truncate_before_check CHECK (truncate_before > 0),
            custom jsonb NOT NULL DEFAULT '{}'::jsonb,
            end_version bigint NOT NULL DEFAULT 0,
            deleted_end bigint,
            hard boolean NOT NULL DEFAULT false
        )
        """
    )
    op.execute("CREATE INDEX streams_stream_type ON eventstore.streams (stream_type, stream_id)")
    op.execute(
        """
        CREATE TABLE eventstore.removed_events (
            global_position bigint PRIMARY KEY,
            transaction_id xid8 NOT NULL
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE eventstore.removed_events")
    op.execute("DROP TABLE eventstore.streams")
