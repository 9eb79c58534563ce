"""The event store: each event's writing transaction (gap-safe `$all`), and the indexes readers page by.

`transaction_id` (`xid8`, the writing transaction's id): `$all` and a stream type's events are read
in (transaction id, position) order, only for transactions below the reader's snapshot xmin, so a
position assigned earlier but committed later is never skipped. Rows stored before this revision
all get this migration's transaction id: they keep their position order.

The streams of a type: a partial index on the first event of each stream.

Revision ID: 0003_es_xact
Revises: 0002
"""

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.types import UserDefinedType

revision = "0003_es_xact"
down_revision = "0002"
branch_labels = None
depends_on = None


class XID8(UserDefinedType[int]):
    """PostgreSQL's 64-bit transaction id, as `eventstore/schema.py` declared it when this revision was
    written (copied, not imported: a migration must not change when the live schema does)."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "XID8"


def upgrade() -> None:
    op.add_column(
        "events",
        sa.Column("transaction_id", XID8(), nullable=False, server_default=sa.text("pg_current_xact_id()")),
        schema="eventstore",
    )
    op.drop_index("events_stream_type_position", table_name="events", schema="eventstore")
    op.create_index("events_transaction_position", "events", ["transaction_id", "global_position"], schema="eventstore")
    op.create_index(
        "events_stream_type_transaction_position",
        "events",
        ["stream_type", "transaction_id", "global_position"],
        schema="eventstore",
    )
    op.create_index(
        "events_stream_type_streams",
        "events",
        ["stream_type", "stream_id"],
        schema="eventstore",
        postgresql_where=sa.text("version = 1"),
    )


def downgrade() -> None:
    op.drop_index("events_stream_type_streams", table_name="events", schema="eventstore")
    op.drop_index("events_stream_type_transaction_position", table_name="events", schema="eventstore")
    op.drop_index("events_transaction_position", table_name="events", schema="eventstore")
    op.create_index("events_stream_type_position", "events", ["stream_type", "global_position"], schema="eventstore")
    op.drop_column("events", "transaction_id", schema="eventstore")
