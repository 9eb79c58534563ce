"""Consumer groups that can say no: nacked records waiting for their retry, and parked records; a
member's nack policy and server-side filter (`consumers.members`).

`consumers.retries`: a record a member nacked, with its attempts and when it may be delivered again;
its partition's delivery waits at it until then, and no commit passes it before it was delivered
again. `consumers.parked`: records a member parked (or nacked past its `max_retries`), copied whole
(the log's retention may delete the original), with the reason and attempts; `state` is `parked`,
`replaying` (handed back to the group by a replay) or `replayed` (a member committed after it).
The group's parked topic in the log is the record of what was parked; this table keeps the
replay state and the copy a replay hands back.

Revision ID: 0005_consumer_nacks
Revises: 0004_sinks
"""

from alembic import op

revision = "0005_consumer_nacks"
down_revision = "0004_sinks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE consumers.members ADD COLUMN IF NOT EXISTS max_retries integer")
    op.execute("ALTER TABLE consumers.members ADD COLUMN IF NOT EXISTS retry_backoff_ms integer")
    op.execute("ALTER TABLE consumers.members ADD COLUMN IF NOT EXISTS filter jsonb")
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS consumers.retries (
            group_id text NOT NULL REFERENCES consumers.groups ON DELETE CASCADE,
            topic text NOT NULL,
            partition integer NOT NULL,
            "offset" bigint NOT NULL,
            attempts integer NOT NULL,
            retry_at timestamptz NOT NULL,
            redelivered boolean NOT NULL DEFAULT false,
            reason text,
            PRIMARY KEY (group_id, topic, partition, "offset")
        )
        """
    )
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS consumers.parked (
            group_id text NOT NULL REFERENCES consumers.groups ON DELETE CASCADE,
            topic text NOT NULL,
            partition integer NOT NULL,
            "offset" bigint NOT NULL,
            timestamp_ms bigint NOT NULL,
            key bytea,
            value bytea,
            headers bytea,
            reason text NOT NULL,
            attempts integer NOT NULL,
            parked_at timestamptz NOT NULL DEFAULT now(),
            parked_by text,
            state text NOT NULL DEFAULT 'parked' CHECK (state IN ('parked', 'replaying', 'replayed')),
            replays integer NOT NULL DEFAULT 0,
            handed_to text,
            replayed_at timestamptz,
            PRIMARY KEY (group_id, topic, partition, "offset")
        )
        """
    )
    # every pull asks for the records being replayed: few, among possibly many parked ones
    op.execute("CREATE INDEX IF NOT EXISTS parked_replaying ON consumers.parked (group_id) WHERE state = 'replaying'")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS consumers.parked")
    op.execute("DROP TABLE IF EXISTS consumers.retries")
    op.execute("ALTER TABLE consumers.members DROP COLUMN IF EXISTS filter")
    op.execute("ALTER TABLE consumers.members DROP COLUMN IF EXISTS retry_backoff_ms")
    op.execute("ALTER TABLE consumers.members DROP COLUMN IF EXISTS max_retries")
