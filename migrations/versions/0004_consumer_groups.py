"""Consumer groups: schema `consumers` with groups, members, assignments, offsets, out_of_range.

A group's committed offsets live in the service database beside the projections' checkpoints: one
place to back up, a transaction per commit (the generation check and the offset write are one
transaction under the group's row lock: fencing without a second mechanism), and a group survives
the restart of every process. `tributary.consumers.coordinator` is the only code that writes them.

The fourth migration: its file was renamed from `0003_consumer_groups.py` so that files sort in the
order they run; its revision id (stored in `eventstore.alembic_version`) stays `0003_consumer_groups`.

Revision ID: 0003_consumer_groups
Revises: 0003_es_xact
"""

from alembic import op

revision = "0003_consumer_groups"
down_revision = "0003_es_xact"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE SCHEMA IF NOT EXISTS consumers")
    op.execute(
        """
        CREATE TABLE consumers.groups (
            group_id text PRIMARY KEY,
            generation bigint NOT NULL DEFAULT 0,
            layout jsonb NOT NULL DEFAULT '{}',
            created_at timestamptz NOT NULL DEFAULT now(),
            rebalanced_at timestamptz
        )
        """
    )
    op.execute(
        """
        CREATE TABLE consumers.members (
            group_id text NOT NULL REFERENCES consumers.groups ON DELETE CASCADE,
            member_id text NOT NULL,
            topics text[] NOT NULL,
            session_timeout_ms integer NOT NULL,
            auto_offset_reset text NOT NULL CHECK (auto_offset_reset IN ('earliest', 'latest', 'error')),
            auto_commit boolean NOT NULL DEFAULT false,
            joined_at timestamptz NOT NULL DEFAULT now(),
            last_heartbeat timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (group_id, member_id)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE consumers.assignments (
            group_id text NOT NULL,
            topic text NOT NULL,
            partition integer NOT NULL,
            member_id text NOT NULL,
            generation bigint NOT NULL,
            position bigint,
            PRIMARY KEY (group_id, topic, partition),
            FOREIGN KEY (group_id, member_id) REFERENCES consumers.members ON DELETE CASCADE
        )
        """
    )
    op.execute("CREATE INDEX assignments_by_member ON consumers.assignments (group_id, member_id)")
    op.execute(
        """
        CREATE TABLE consumers.offsets (
            group_id text NOT NULL REFERENCES consumers.groups ON DELETE CASCADE,
            topic text NOT NULL,
            partition integer NOT NULL,
            committed_offset bigint NOT NULL CHECK (committed_offset >= 0),
            committed_at timestamptz NOT NULL DEFAULT now(),
            member_id text,
            generation bigint,
            PRIMARY KEY (group_id, topic, partition)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE consumers.out_of_range (
            group_id text NOT NULL REFERENCES consumers.groups ON DELETE CASCADE,
            topic text NOT NULL,
            partition integer NOT NULL,
            at timestamptz NOT NULL DEFAULT now(),
            position bigint NOT NULL,
            start_offset bigint NOT NULL,
            end_offset bigint NOT NULL,
            action text NOT NULL,
            member_id text,
            PRIMARY KEY (group_id, topic, partition)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP SCHEMA consumers CASCADE")
