"""Projection bookkeeping: schema tributary_projections with builds, checkpoints, dead_letters.

Before this revision the projection runner created these tables itself on first use
(`projections.store.Store.ensure`). Every statement here is idempotent, so a database where the
runner already made them is adopted as it is (rows kept) and only gains what is new: the
checkpoints' truncate point (`truncate_event_time`, `truncate_offset`: the latest CDC truncate
seen on that topic-partition, in the order a fold sees records).

Per-build objects (`<name>__v<version>_<build>` in the views schema, `…__state` here) stay the
runner's: they come and go with builds.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE SCHEMA IF NOT EXISTS tributary_projections")
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS tributary_projections.builds (
            projection text NOT NULL,
            build integer NOT NULL,
            version integer NOT NULL,
            table_name text NOT NULL,
            status text NOT NULL,
            error text,
            started_at timestamptz NOT NULL DEFAULT now(),
            finished_at timestamptz,
            records bigint NOT NULL DEFAULT 0,
            current boolean NOT NULL DEFAULT false,
            PRIMARY KEY (projection, build)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS tributary_projections.checkpoints (
            projection text NOT NULL,
            build integer NOT NULL,
            topic text NOT NULL,
            partition integer NOT NULL,
            next_offset bigint NOT NULL,
            max_event_time bigint,
            PRIMARY KEY (projection, build, topic, partition)
        )
        """
    )
    op.execute(
        "ALTER TABLE tributary_projections.checkpoints "
        "ADD COLUMN IF NOT EXISTS truncate_event_time bigint, "
        "ADD COLUMN IF NOT EXISTS truncate_offset bigint"
    )
    op.execute(
        """
        CREATE TABLE IF NOT EXISTS tributary_projections.dead_letters (
            projection text NOT NULL,
            build integer NOT NULL,
            topic text NOT NULL,
            partition integer NOT NULL,
            "offset" bigint NOT NULL,
            error text NOT NULL,
            at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (projection, build, topic, partition, "offset")
        )
        """
    )


def downgrade() -> None:
    # Hand the tables back to the runner (which created them before this revision, and still
    # creates them where they are missing) instead of dropping every projection's progress.
    pass
