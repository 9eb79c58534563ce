"""Event store: one encryption key per data subject and key version (personal data in events).

Revision ID: 0007_subject_keys
Revises: 0006_stream_lifecycle
"""

from alembic import op

revision = "0007_subject_keys"
down_revision = "0006_stream_lifecycle"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE eventstore.subject_keys (
            subject_id text NOT NULL,
            kid integer NOT NULL,
            key bytea,
            created_at timestamptz NOT NULL DEFAULT now(),
            destroyed_at timestamptz,
            CONSTRAINT subject_keys_pkey PRIMARY KEY (subject_id, kid),
            CONSTRAINT subject_keys_destroyed_check CHECK ((key IS NULL) = (destroyed_at IS NOT NULL))
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS eventstore.subject_keys")
