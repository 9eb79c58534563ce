"""The event store's tables, once, as SQLAlchemy Core metadata (schema `eventstore`).

The store composes its statements from these tables (`eventstore/statements.py`), and Alembic
compares them with the database (`migrations/env.py` sets them as `target_metadata`): a test runs
Alembic's autogenerate comparison after `upgrade head` and expects no difference, so a migration
and this file cannot drift apart.

`transaction_id` is the writing transaction's id (`xid8`, PostgreSQL 13+): a position is assigned
at INSERT, not at COMMIT, so `$all` pages by (transaction id, position) and returns only events of
transactions every reader sees as finished (below the snapshot's xmin; see `read_all`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP, UUID
from sqlalchemy.types import UserDefinedType

__all__ = [
    "SCHEMA",
    "XID8",
    "commands",
    "events",
    "metadata",
    "removed_events",
    "snapshots",
    "streams",
    "subject_keys",
]

SCHEMA = "eventstore"


class XID8(UserDefinedType[int]):
    """PostgreSQL's 64-bit transaction id (`pg_current_xact_id()`); SQLAlchemy has no type for it."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:
        return "XID8"


metadata = MetaData(schema=SCHEMA)

events = Table(
    "events",
    metadata,
    Column("global_position", BigInteger, Identity(always=True), primary_key=True),
    Column("stream_id", Text, nullable=False),
    Column("stream_type", Text, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("event_id", UUID(as_uuid=True), nullable=False),
    Column("type", Text, nullable=False),
    Column("schema_version", Integer, nullable=False, server_default=text("1")),
    Column("data", JSONB, nullable=False),
    Column("metadata", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("occurred_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")),
    Column("recorded_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")),
    Column("transaction_id", XID8(), nullable=False, server_default=text("pg_current_xact_id()")),
    CheckConstraint("version > 0", name="events_version_check"),
    UniqueConstraint("stream_id", "version", name="events_stream_version_key"),
    UniqueConstraint("event_id", name="events_event_id_key"),
    # `$all` and a stream type's events, in the order readers page them (gap-safe: see read_all).
    Index("events_transaction_position", "transaction_id", "global_position"),
    Index("events_stream_type_transaction_position", "stream_type", "transaction_id", "global_position"),
    # The streams of a type: one entry per stream (its first event), in stream id order.
    Index("events_stream_type_streams", "stream_type", "stream_id", postgresql_where=text("version = 1")),
)

commands = Table(
    "commands",
    metadata,
    Column("command_id", Text, primary_key=True),
    Column("stream_id", Text, nullable=False),
    Column("request_hash", Text, nullable=False),
    Column("response", JSONB, nullable=False),
    Column("created_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")),
)

snapshots = Table(
    "snapshots",
    metadata,
    Column("stream_id", Text, primary_key=True),
    Column("stream_type", Text, nullable=False),
    Column("version", BigInteger, nullable=False),
    Column("state", JSONB, nullable=False),
    Column("state_version", Integer, nullable=False, server_default=text("1")),
    Column("taken_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")),
    # The subject keys (`[[subject, kid], …]`) the state's personal data was revealed with; null: none.
    # A snapshot is written only while they all live, and forgetting a subject deletes it.
    Column("key_ids", JSONB, nullable=True),
)

# One AES-256 key per data subject and key version (`kid`): personal-data fields of events are
# sealed under the newest (eventstore/personal.py). Forgetting a subject sets `key` to NULL and
# `destroyed_at`: the row stays, so a later key for the subject gets a new kid.
subject_keys = Table(
    "subject_keys",
    metadata,
    Column("subject_id", Text, nullable=False),
    Column("kid", Integer, nullable=False),
    Column("key", LargeBinary, nullable=True),
    Column("created_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")),
    Column("destroyed_at", TIMESTAMP(timezone=True), nullable=True),
    PrimaryKeyConstraint("subject_id", "kid", name="subject_keys_pkey"),
    CheckConstraint("(key IS NULL) = (destroyed_at IS NOT NULL)", name="subject_keys_destroyed_check"),
)

# A stream's lifecycle (KurrentDB's `$$stream` metastream): a row only for a stream whose metadata
# was written or that was deleted, so a plain append reads it by primary key and never writes it.
# `end_version` keeps the stream's end once its last events may be gone (a scavenge, a delete):
# versions stay gapless and an append continues after it. `deleted_end`: a soft delete hid the
# versions up to it; `hard`: a tombstone, the id is never used again.
streams = Table(
    "streams",
    metadata,
    Column("stream_id", Text, primary_key=True),
    Column("stream_type", Text),
    Column("metadata_version", BigInteger, nullable=False, server_default=text("0")),
    Column("max_age", BigInteger),
    Column("max_count", BigInteger),
    Column("truncate_before", BigInteger),
    Column("custom", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("end_version", BigInteger, nullable=False, server_default=text("0")),
    Column("deleted_end", BigInteger),
    Column("hard", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint("max_age > 0", name="streams_max_age_check"),
    CheckConstraint("max_count > 0", name="streams_max_count_check"),
    CheckConstraint("truncate_before > 0", name="streams_truncate_before_check"),
    Index("streams_stream_type", "stream_type", "stream_id"),
)

# Where the events a scavenge or delete removed stood in `$all`: a reader that continues after the
# position of a removed event still finds its place (`statements.READ_ALL`).
removed_events = Table(
    "removed_events",
    metadata,
    Column("global_position", BigInteger, primary_key=True, autoincrement=False),
    Column("transaction_id", XID8(), nullable=False),
    # A scavenge forgets positions removed longer ago than `[eventstore] removed_positions_keep_s`.
    Column("removed_at", TIMESTAMP(timezone=True), nullable=False, server_default=text("now()")),
    Index("removed_events_removed_at", "removed_at"),
)
