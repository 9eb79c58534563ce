"""Event store: when each removed event's position was removed, so a scavenge can forget the
positions no reader will continue from any more (`[eventstore] removed_positions_keep_s`).

Revision ID: 0009_removed_at
Revises: 0008_snapshot_keys
"""

from alembic import op

revision = "0009_removed_at"
down_revision = "0008_snapshot_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE eventstore.removed_events ADD COLUMN removed_at timestamptz NOT NULL DEFAULT now()")
    op.execute("CREATE INDEX removed_events_removed_at ON eventstore.removed_events (removed_at)")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS eventstore.removed_events_removed_at")
    op.execute("ALTER TABLE eventstore.removed_events DROP COLUMN IF EXISTS removed_at")
