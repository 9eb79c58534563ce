"""The store's SQL, composed from the tables in `schema.py` and compiled once, at import, to text
for psycopg (positional `%s` parameters: cheaper per call than named ones). The store executes the
text through its psycopg pool: SQLAlchemy builds statements, it never runs them.

Each statement states the order of its parameters (`_compiled(..., order=…)`); compilation checks
it, so a change to a statement cannot silently shift the values the store passes.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    Integer,
    Select,
    Text,
    and_,
    any_,
    bindparam,
    cast,
    exists,
    func,
    insert,
    literal_column,
    not_,
    null,
    or_,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TIMESTAMP, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement
from sqlalchemy.types import TypeEngine

from tributary.eventstore.schema import commands, events, removed_events, snapshots, streams, subject_keys

__all__ = [
    "BY_IDS",
    "CMD_GET",
    "CMD_PUT",
    "CURRENT",
    "DELETE_STREAM",
    "EMIT_DELETED",
    "INSERT_MANY",
    "INSERT_ONE",
    "KEEP_END",
    "LOAD",
    "META_PUT",
    "META_PUT_ANY",
    "POSITION_EXISTS",
    "READ_ALL",
    "READ_ALL_FILTERED",
    "READ_ALL_HEAD",
    "READ_BWD",
    "READ_FWD",
    "PRUNE_REMOVED",
    "SCAVENGE_BATCH",
    "SCAVENGE_STREAMS",
    "SNAP_DROP",
    "SNAP_GET",
    "SNAP_PUT",
    "SNAP_PUT_AFTER",
    "STREAMS_OF_TYPE",
    "STREAM_STATE",
    "VISIBLE",
]

_DIALECT = pg_psycopg.dialect(paramstyle="format")  # type: ignore[no-untyped-call]  # SQLAlchemy's dialects are unannotated
ev = events.c


def _compiled(statement: ClauseElement, order: tuple[str, ...]) -> str:
    compiled = statement.compile(dialect=_DIALECT)
    assert isinstance(compiled, SQLCompiler)
    if tuple(compiled.positiontup or ()) != order:
        raise AssertionError(f"parameters of {statement!r}: {compiled.positiontup}, not {order}")
    return str(compiled)


def _p(name: str, type_: TypeEngine[Any] | type[TypeEngine[Any]] | None = None) -> ColumnElement[object]:
    return bindparam(name, type_=type_)


# A recorded event as reads return it (RecordedEvent's fields, in order).
COLUMNS = (
    ev.global_position,
    ev.stream_id,
    ev.stream_type,
    ev.version,
    ev.event_id,
    ev.type,
    ev.schema_version,
    ev.data,
    ev.metadata,
    ev.occurred_at,
    ev.recorded_at,
)
_TARGET = [
    "stream_id",
    "stream_type",
    "version",
    "event_id",
    "type",
    "schema_version",
    "data",
    "metadata",
    "occurred_at",
]
_VALUES = ("event_id", "type", "schema_version", "data", "metadata", "occurred_at")
_ZERO = literal_column("0", BigInteger)
_ONE = literal_column("1", BigInteger)

st = streams.c
_FALSE: ColumnElement[bool] = literal_column("false", Boolean)


def _life(stream: str, *columns: ColumnElement[Any]) -> Any:
    """One row of aggregates over the stream's lifecycle row, present or not (a CTE `life`)."""
    return select(*columns).where(st.stream_id == _p(stream)).cte("life")


def _end(stream: str) -> ColumnElement[Any]:
    """The stream's end: its last stored version, or the end `streams` kept once those are gone."""
    last = select(func.max(ev.version)).where(ev.stream_id == _p(stream)).scalar_subquery()
    kept = select(st.end_version).where(st.stream_id == _p(stream)).scalar_subquery()
    return func.greatest(func.coalesce(last, _ZERO), func.coalesce(kept, _ZERO))


CURRENT = _compiled(select(_end("stream_id")), ("stream_id", "stream_id"))


# -- appends: one statement does the expected-version check and the insert --------------------------
# One statement text per mode (the server plans a plain comparison, no CASE); a single event as
# scalar parameters, a batch as arrays through `unnest … WITH ORDINALITY`. Only what the server
# decides comes back (position, version, recorded_at; a batch adds the event id to match rows).
def _one_values() -> list[ColumnElement[object]]:
    return [
        _p("event_id"),
        _p("type"),
        _p("schema_version"),
        cast(_p("data"), JSONB),
        cast(_p("metadata"), JSONB),
        _p("occurred_at"),
    ]


_batch = (
    func.unnest(
        _p("event_ids", ARRAY(UUID)),
        _p("types", ARRAY(Text)),
        _p("schema_versions", ARRAY(Integer)),
        _p("datas", ARRAY(Text)),
        _p("metadatas", ARRAY(Text)),
        _p("occurred_ats", ARRAY(TIMESTAMP(timezone=True))),
    )
    .table_valued("e", "t", "sv", "d", "m", "o", with_ordinality="n")
    .render_derived(name="x")
)
_BATCH_ORDER = ("event_ids", "types", "schema_versions", "datas", "metadatas", "occurred_ats")


def _many_values() -> list[ColumnElement[object]]:
    x = _batch.c
    return [x.e, x.t, x.sv, cast(x.d, JSONB), cast(x.m, JSONB), x.o]


def _insert(source: Select[tuple[object, ...]], many: bool) -> ClauseElement:
    returning = (
        [ev.global_position, ev.version, ev.event_id, ev.recorded_at]
        if many
        else [
            ev.global_position,
            ev.version,
            ev.recorded_at,
        ]
    )
    return insert(events).from_select(_TARGET, source).returning(*returning)


def _modes(many: bool) -> dict[str, str]:
    values = _many_values() if many else _one_values()
    value_order = _BATCH_ORDER if many else _VALUES
    step = _batch.c.n if many else _ONE
    out: dict[str, str] = {}

    # `any` / `stream_exists`: versions follow the stream's current end, `max(version)`.
    # The lifecycle row, read by primary key and never written here: a tombstone refuses every
    # append, and the end it keeps (events removed by a scavenge or a delete) is where versions
    # continue. Uncorrelated subqueries (the server runs each once, as an init plan): a stream
    # without a row costs one index probe that finds nothing.
    def _row(name: str, *where: ColumnElement[bool]) -> ColumnElement[bool]:
        return exists().where(st.stream_id == _p(name), *where)

    def _kept(name: str, column: ColumnElement[Any]) -> ColumnElement[Any]:
        return func.coalesce(select(column).where(st.stream_id == _p(name)).scalar_subquery(), _ZERO)

    cur = (
        select(func.coalesce(func.max(ev.version), _ZERO).label("v")).where(ev.stream_id == _p("cur_stream")).cte("cur")
    )
    end = func.greatest(cur.c.v, _kept("end_stream", st.end_version))
    for mode in ("any", "stream_exists"):
        source = select(_p("stream_id", Text), _p("stream_type", Text), end + step, *values)
        source = source.select_from(cur, _batch) if many else source.select_from(cur)
        source = source.where(not_(_row("tomb_stream", st.hard)))
        order: tuple[str, ...] = ("cur_stream", "stream_id", "stream_type", "end_stream", *value_order, "tomb_stream")
        if mode == "stream_exists":  # a soft-deleted stream exists again once it has new events
            source = source.where(end > _kept("deleted_stream", st.deleted_end))
            order = (*order, "deleted_stream", "end_stream")
        out[mode] = _compiled(_insert(source, many), order)
    # `no_stream`: a new stream at 1, or a soft-deleted one continuing after its deleted end; the
    # constraint refuses it if the stream has events there, the kept end if they were removed.
    fresh = select(_p("stream_id", Text), _p("stream_type", Text), _kept("d_stream", st.deleted_end) + step, *values)
    if many:
        fresh = fresh.select_from(_batch)
    refused = _row("tomb_stream", or_(st.hard, st.end_version > func.coalesce(st.deleted_end, _ZERO)))
    out["no_stream"] = _compiled(
        _insert(fresh.where(not_(refused)), many), ("stream_id", "stream_type", "d_stream", *value_order, "tomb_stream")
    )
    # An exact version n (the command path: the handler loaded n): the events become n + 1, …, and
    # UNIQUE (stream_id, version) refuses them if n + 1 is taken. What the constraint cannot see is
    # a gap (n missing): so a point lookup of n ("exact"), or none ("new") when n = 0 (`no_stream`)
    # or n is already proven to exist (the store's known versions). Never below a kept end either:
    # the events after n may have been removed, which the constraint cannot see (a scavenge keeps
    # the end before it removes anything).
    exact = select(_p("stream_id", Text), _p("stream_type", Text), _p("n", BigInteger) + step, *values)
    if many:
        exact = exact.select_from(_batch)
    exact = exact.where(not_(_row("tomb_stream", or_(st.hard, st.end_version > _p("n_floor", BigInteger)))))
    out["new"] = _compiled(
        _insert(exact, many), ("stream_id", "stream_type", "n", *value_order, "tomb_stream", "n_floor")
    )
    # n exists: its event is stored, or it is the end the lifecycle row kept when events were removed.
    has_n = or_(
        exists().where(ev.stream_id == _p("n_stream"), ev.version == _p("n_version")),
        _row("end_stream", st.end_version == _p("n_end", BigInteger)),
    )
    out["exact"] = _compiled(
        _insert(exact.where(has_n), many),
        (
            "stream_id",
            "stream_type",
            "n",
            *value_order,
            "tomb_stream",
            "n_floor",
            "n_stream",
            "n_version",
            "end_stream",
            "n_end",
        ),
    )
    return out


INSERT_ONE = _modes(many=False)
INSERT_MANY = _modes(many=True)

BY_IDS = _compiled(select(*COLUMNS).where(ev.event_id == any_(_p("ids", ARRAY(UUID)))).order_by(ev.version), ("ids",))

# -- reads -------------------------------------------------------------------------------------------
# What a stream's lifecycle row hides at once, before a scavenge removes it (KurrentDB: `$tb`,
# `$maxCount`, `$maxAge`, a soft delete; a tombstone hides all): reads join the row by stream id.
_later = events.alias("later")
_last_of = select(func.max(_later.c.version)).where(_later.c.stream_id == ev.stream_id).scalar_subquery()
VISIBLE = or_(
    st.stream_id.is_(None),
    and_(
        not_(st.hard),
        ev.version > func.coalesce(st.deleted_end, _ZERO),
        ev.version >= func.coalesce(st.truncate_before, _ZERO),
        or_(st.max_age.is_(None), ev.recorded_at >= func.now() - st.max_age * literal_column("interval '1 second'")),
        or_(st.max_count.is_(None), ev.version > _last_of - st.max_count),
    ),
)
_WITH_LIFE = events.outerjoin(streams, st.stream_id == ev.stream_id)


def _visible(*columns: Any) -> Select[Any]:
    return select(*columns).select_from(_WITH_LIFE).where(VISIBLE)


READ_FWD = _compiled(
    _visible(*COLUMNS)
    .where(ev.stream_id == _p("stream_id"), ev.version >= _p("version"))
    .order_by(ev.version)
    .limit(_p("limit")),
    ("stream_id", "version", "limit"),
)
READ_BWD = _compiled(
    _visible(*COLUMNS)
    .where(ev.stream_id == _p("stream_id"), ev.version <= _p("version"))
    .order_by(ev.version.desc())
    .limit(_p("limit")),
    ("stream_id", "version", "limit"),
)

# A command's load, one statement: the stream's snapshot of the aggregate's state version (a row
# whose `global_position` is NULL: its version, and its state in the `data` column), then the
# events after it (after version 0 without one), in version order — the snapshot row first, as
# every event after it has a higher version. One snapshot of the database for both: a snapshot
# written meanwhile cannot be paired with events read before it.
_snap = (
    select(snapshots.c.version, snapshots.c.state, snapshots.c.key_ids)
    .where(snapshots.c.stream_id == _p("snap_stream"), snapshots.c.state_version == _p("state_version"))
    .cte("snap")
)
_snap_row = select(
    cast(null(), BigInteger).label("global_position"),
    cast(null(), Text).label("stream_id"),
    cast(null(), Text).label("stream_type"),
    _snap.c.version,
    cast(null(), UUID).label("event_id"),
    cast(null(), Text).label("type"),
    cast(null(), Integer).label("schema_version"),
    _snap.c.state.label("data"),
    _snap.c.key_ids.label("metadata"),  # the keys its state was revealed with
    cast(null(), TIMESTAMP(timezone=True)).label("occurred_at"),
    cast(null(), TIMESTAMP(timezone=True)).label("recorded_at"),
)
_tail = _visible(*COLUMNS).where(
    ev.stream_id == _p("stream_id"),
    ev.version > func.coalesce(select(_snap.c.version).scalar_subquery(), _ZERO),
)
LOAD = _compiled(
    union_all(_snap_row, _tail).order_by(literal_column("version")),
    ("snap_stream", "state_version", "stream_id"),
)

# `$all` (and one stream type's events), gap-safe: a position is assigned at INSERT, not at COMMIT,
# so an event of position p can become visible after one of position p + 1. Readers page by
# (transaction id, position) and see only transactions below their snapshot's xmin (every
# transaction that could still commit has a larger id): whatever becomes visible later sorts after
# everything already returned. The position to continue from names its row, whose transaction id
# the statement looks up (`_after`).
_xmin = func.pg_snapshot_xmin(func.pg_current_snapshot())
_prior = events.alias("prior")
_gone = removed_events.c
# The event at `after`, stored or removed since (a reader continues from where it stood).
_after_xid = func.coalesce(
    select(_prior.c.transaction_id).where(_prior.c.global_position == _p("after")).scalar_subquery(),
    select(_gone.transaction_id).where(_gone.global_position == _p("after_gone")).scalar_subquery(),
)
_after = tuple_(_after_xid, _p("after_at", BigInteger))


def _read_all(*, typed: bool, from_start: bool, filtered: bool = False) -> str:
    query = _visible(*COLUMNS).where(ev.transaction_id < _xmin)
    order: tuple[str, ...] = ()
    if typed:
        query, order = query.where(ev.stream_type == _p("stream_type")), ("stream_type",)
    if filtered:  # a subscription's server-side filter: a stream id prefix, event types (either may be null)
        prefix, types = _p("prefix", Text), _p("types", ARRAY(Text))
        query = query.where(
            or_(prefix.is_(None), func.starts_with(ev.stream_id, prefix)),
            or_(types.is_(None), ev.type == any_(types)),
        )
        order = (*order, "prefix", "prefix", "types", "types")
    if not from_start:
        query, order = (
            query.where(tuple_(ev.transaction_id, ev.global_position) > _after),
            (*order, "after", "after_gone", "after_at"),
        )
    query = query.order_by(ev.transaction_id, ev.global_position).limit(_p("limit"))
    return _compiled(query, (*order, "limit"))


READ_ALL = {
    (typed, start): _read_all(typed=typed, from_start=start) for typed in (False, True) for start in (False, True)
}
READ_ALL_FILTERED = {
    (typed, start): _read_all(typed=typed, from_start=start, filtered=True)
    for typed in (False, True)
    for start in (False, True)
}
# The last event a reader could be given now (a subscription's cheap "anything new?").
READ_ALL_HEAD = _compiled(
    select(ev.global_position)
    .where(ev.transaction_id < _xmin)
    .order_by(ev.transaction_id.desc(), ev.global_position.desc())
    .limit(_ONE),
    (),
)
POSITION_EXISTS = _compiled(
    select(
        or_(
            exists().where(ev.global_position == _p("position")),
            exists().where(_gone.global_position == _p("gone_position")),
        )
    ),
    ("position", "gone_position"),
)

# The streams of a type, by stream id: a partial index holds each stream's first event, and the
# lifecycle rows (by type) the streams whose first events a scavenge removed. Each with its end,
# its first stored event's time (None: nothing stored) and how it was deleted, for the store to
# leave the deleted ones out.
_stream = events.alias("stream")
_candidates = union_all(
    select(ev.stream_id.label("id")).where(
        ev.stream_type == _p("stream_type"), ev.version == _ONE, ev.stream_id > _p("after")
    ),
    select(st.stream_id.label("id")).where(st.stream_type == _p("life_type"), st.stream_id > _p("life_after")),
).subquery("candidates")
_ids = select(_candidates.c.id).distinct().order_by(_candidates.c.id).limit(_p("limit")).subquery("ids")
STREAMS_OF_TYPE = _compiled(
    select(
        _ids.c.id,
        func.greatest(
            func.coalesce(
                select(func.max(_stream.c.version)).where(_stream.c.stream_id == _ids.c.id).scalar_subquery(), _ZERO
            ),
            func.coalesce(st.end_version, _ZERO),
        ),
        select(func.min(_stream.c.recorded_at)).where(_stream.c.stream_id == _ids.c.id).scalar_subquery(),
        func.coalesce(st.hard, _FALSE),
        st.deleted_end,
    )
    .select_from(_ids.outerjoin(streams, st.stream_id == _ids.c.id))
    .order_by(_ids.c.id),
    ("stream_type", "after", "life_type", "life_after", "limit"),
)

# -- idempotency records and snapshots ----------------------------------------------------------------
CMD_GET = _compiled(
    select(commands.c.request_hash, commands.c.response).where(commands.c.command_id == _p("command_id")),
    ("command_id",),
)
CMD_PUT = _compiled(
    insert(commands).values(
        command_id=_p("command_id"), stream_id=_p("stream_id"), request_hash=_p("hash"), response=_p("response")
    ),
    ("command_id", "stream_id", "hash", "response"),
)
SNAP_GET = _compiled(
    select(snapshots.c.version, snapshots.c.state, snapshots.c.state_version).where(
        snapshots.c.stream_id == _p("stream_id")
    ),
    ("stream_id",),
)
_SNAP_ORDER = ("stream_id", "stream_type", "version", "state", "state_version")


def _snap_put(statement: object) -> ClauseElement:
    assert isinstance(statement, type(pg_insert(snapshots)))
    return statement.on_conflict_do_update(
        index_elements=[snapshots.c.stream_id],
        set_={
            "version": statement.excluded.version,
            "state": statement.excluded.state,
            "state_version": statement.excluded.state_version,
            "key_ids": statement.excluded.key_ids,
            "taken_at": func.now(),
        },
        where=snapshots.c.version < statement.excluded.version,
    )


SNAP_PUT = _compiled(_snap_put(pg_insert(snapshots).values(**{k: _p(k) for k in _SNAP_ORDER})), _SNAP_ORDER)
# The snapshot a command takes, sent with its append (same implicit transaction, same round trip):
# written only if that append's last event is stored, so a refused append leaves no snapshot, and
# only while every key its state was revealed with lives. Those key rows are locked FOR SHARE: a
# subject's forget (which sets its keys to NULL) waits for this transaction, then deletes the
# snapshot; after a forget that came first a key is NULL, and no snapshot is written.
_appended = exists().where(ev.stream_id == _p("ev_stream"), ev.version == _p("ev_version"), ev.event_id == _p("ev_id"))
_used = (
    func.unnest(_p("key_subjects", ARRAY(Text)), _p("key_kids", ARRAY(Integer)))
    .table_valued("subject_id", "kid")
    .render_derived(name="used")
)
_live_keys = (
    select(subject_keys.c.kid)
    .join(_used, and_(_used.c.subject_id == subject_keys.c.subject_id, _used.c.kid == subject_keys.c.kid))
    .where(subject_keys.c.key.is_not(None))
    .with_for_update(read=True, of=subject_keys)
    .subquery("live_keys")
)
_all_keys_live = select(func.count()).select_from(_live_keys).scalar_subquery() == _p("key_count", BigInteger)
SNAP_PUT_AFTER = _compiled(
    _snap_put(
        pg_insert(snapshots).from_select(
            [*_SNAP_ORDER, "key_ids"],
            select(
                _p("stream_id", Text),
                _p("stream_type", Text),
                _p("version", BigInteger),
                cast(_p("state"), JSONB),
                _p("state_version", Integer),
                cast(_p("key_ids"), JSONB),
            ).where(_appended, _all_keys_live),
        )
    ),
    (*_SNAP_ORDER, "key_ids", "ev_stream", "ev_version", "ev_id", "key_subjects", "key_kids", "key_count"),
)

# -- a stream's lifecycle: metadata, deletes, scavenge -------------------------------------------------
# The stream's state in one row, with or without a lifecycle row: its end, what deleted it, and
# its metadata (the `$$stream` metastream of KurrentDB, with its own version).
_asked = select(_p("stream_id", Text).label("id")).subquery("asked")
_any_type = select(ev.stream_type).where(ev.stream_id == _asked.c.id).limit(_ONE).scalar_subquery()
STREAM_STATE = _compiled(
    select(
        func.greatest(
            func.coalesce(select(func.max(ev.version)).where(ev.stream_id == _asked.c.id).scalar_subquery(), _ZERO),
            func.coalesce(st.end_version, _ZERO),
        ),
        st.deleted_end,
        func.coalesce(st.hard, _FALSE),
        func.coalesce(st.metadata_version, _ZERO),
        st.max_age,
        st.max_count,
        st.truncate_before,
        st.custom,
        func.coalesce(st.stream_type, _any_type),
    ).select_from(_asked.outerjoin(streams, st.stream_id == _asked.c.id)),
    ("stream_id",),
)
_META = ("max_age", "max_count", "truncate_before", "custom")
_meta_insert = pg_insert(streams).values(
    stream_id=_p("stream_id"),
    metadata_version=_ONE,
    max_age=_p("max_age", BigInteger),
    max_count=_p("max_count", BigInteger),
    truncate_before=_p("truncate_before", BigInteger),
    custom=cast(_p("custom", Text), JSONB),
)
_meta_set = {
    "metadata_version": st.metadata_version + _ONE,
    **{k: getattr(_meta_insert.excluded, k) for k in _META},
}
# Written when the metadata is at `expected` (0: never written): a conflict returns no row.
META_PUT = _compiled(
    _meta_insert.on_conflict_do_update(
        index_elements=[st.stream_id], set_=_meta_set, where=st.metadata_version == _p("expected", BigInteger)
    ).returning(st.metadata_version),
    ("stream_id", "max_age", "max_count", "truncate_before", "custom", "expected"),
)
# Whatever version it is at (`expected_version="any"`).
META_PUT_ANY = _compiled(
    _meta_insert.on_conflict_do_update(index_elements=[st.stream_id], set_=_meta_set).returning(st.metadata_version),
    ("stream_id", "max_age", "max_count", "truncate_before", "custom"),
)
# A delete: the stream's end is kept (versions continue after it); soft hides up to it, hard
# hides all, for good. Also where the stream's type is kept (the log's topic for its delete marker).
_del_insert = pg_insert(streams).values(
    stream_id=_p("stream_id"),
    stream_type=_p("stream_type", Text),
    end_version=_p("end", BigInteger),
    deleted_end=_p("deleted_end", BigInteger),
    hard=_p("hard", Boolean),
)
DELETE_STREAM = _compiled(
    _del_insert.on_conflict_do_update(
        index_elements=[st.stream_id],
        set_={
            "stream_type": func.coalesce(_del_insert.excluded.stream_type, st.stream_type),
            "end_version": func.greatest(st.end_version, _del_insert.excluded.end_version),
            "deleted_end": _del_insert.excluded.deleted_end,
            "hard": _del_insert.excluded.hard,
        },
        where=not_(st.hard),
    ).returning(st.stream_id),
    ("stream_id", "stream_type", "end", "deleted_end", "hard"),
)
SNAP_DROP = _compiled(snapshots.delete().where(snapshots.c.stream_id == _p("stream_id")), ("stream_id",))
# Told to capture, in the delete's transaction: the outbox routes it to the stream's topic
# (capture/records/outbox.py), where consumers learn to drop the stream.
EMIT_DELETED = "SELECT pg_logical_emit_message(true, %s, %s)"

# The scavenge, stream by stream (those with a lifecycle row), in short transactions of a batch:
# first the end is kept (so versions continue after removed events), then the hidden events below
# the first visible one go (oldest first, never a gap in the middle), leaving their place in `$all`.
SCAVENGE_STREAMS = _compiled(
    select(st.stream_id).where(st.stream_id > _p("after")).order_by(st.stream_id).limit(_p("limit")),
    ("after", "limit"),
)
KEEP_END = _compiled(
    update(streams)
    .where(st.stream_id == _p("stream_id"))
    .values(
        end_version=func.greatest(
            st.end_version,
            func.coalesce(
                select(func.max(ev.version)).where(ev.stream_id == _p("max_stream")).scalar_subquery(), _ZERO
            ),
        ),
        # and its type: the streams of a type still list it once its first event is gone
        stream_type=func.coalesce(
            st.stream_type,
            select(ev.stream_type).where(ev.stream_id == _p("type_stream")).limit(_ONE).scalar_subquery(),
        ),
    ),
    ("type_stream", "max_stream", "stream_id"),
)
_first_visible = _visible(func.min(ev.version)).where(ev.stream_id == _p("first_stream")).scalar_subquery()
_doomed = (
    select(ev.global_position)
    .select_from(_WITH_LIFE)
    .where(
        ev.stream_id == _p("stream_id"),
        not_(VISIBLE),
        ev.version < func.coalesce(_first_visible, literal_column(str(2**62), BigInteger)),
    )
    .order_by(ev.version)
    .limit(_p("batch"))
    .cte("doomed")
)
_removed = (
    events.delete()
    .where(ev.global_position.in_(select(_doomed.c.global_position)))
    .returning(ev.global_position, ev.transaction_id)
    .cte("removed")
)
SCAVENGE_BATCH = _compiled(
    pg_insert(removed_events)
    .from_select(["global_position", "transaction_id"], select(_removed.c.global_position, _removed.c.transaction_id))
    .on_conflict_do_nothing()
    .returning(removed_events.c.global_position),
    ("stream_id", "first_stream", "batch"),
)

# Positions removed longer ago than the keep interval, `batch` at a time, oldest first: a reader
# continuing after one of them gets UnknownPosition (404) instead of its place in `$all`.
_stale = (
    select(_gone.global_position)
    .where(_gone.removed_at < func.now() - literal_column("interval '1 second'") * _p("keep_s", Float))
    .order_by(_gone.removed_at)
    .limit(_p("batch"))
    .scalar_subquery()
)
PRUNE_REMOVED = _compiled(removed_events.delete().where(_gone.global_position.in_(_stale)), ("keep_s", "batch"))
