"""Event store: the subject keys a snapshot's state was revealed with (a forgotten subject's key
must never leave its plaintext in a snapshot).

Revision ID: 0008_snapshot_keys
Revises: 0007_subject_keys
"""

from alembic import op

revision = "0008_snapshot_keys"
down_revision = "0007_subject_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE eventstore.snapshots ADD COLUMN key_ids jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE eventstore.snapshots DROP COLUMN IF EXISTS key_ids")
