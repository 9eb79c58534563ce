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
    ColumnElement,
    Integer,
    Select,
    Text,
    any_,
    bindparam,
    cast,
    exists,
    func,
    insert,
    literal_column,
    null,
    or_,
    select,
    tuple_,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TIMESTAMP, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement
from sqlalchemy.types import TypeEngine

from tributary.eventstore.schema import commands, events, snapshots

__all__ = [
    "BY_IDS",
    "CMD_GET",
    "CMD_PUT",
    "CURRENT",
    "INSERT_MANY",
    "INSERT_ONE",
    "LOAD",
    "POSITION_EXISTS",
    "READ_ALL",
    "READ_ALL_FILTERED",
    "READ_ALL_HEAD",
    "READ_BWD",
    "READ_FWD",
    "SNAP_GET",
    "SNAP_PUT",
    "SNAP_PUT_AFTER",
    "STREAMS_OF_TYPE",
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

CURRENT = _compiled(
    select(func.coalesce(func.max(ev.version), _ZERO)).where(ev.stream_id == _p("stream_id")), ("stream_id",)
)


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
    cur = (
        select(func.coalesce(func.max(ev.version), _ZERO).label("v")).where(ev.stream_id == _p("cur_stream")).cte("cur")
    )
    for mode in ("any", "stream_exists"):
        source = select(_p("stream_id", Text), _p("stream_type", Text), cur.c.v + step, *values)
        source = source.select_from(cur, _batch) if many else source.select_from(cur)
        if mode == "stream_exists":
            source = source.where(cur.c.v > _ZERO)
        out[mode] = _compiled(_insert(source, many), ("cur_stream", "stream_id", "stream_type", *value_order))
    # An exact version n (the command path: the handler loaded n): the events become n + 1, …, and
    # UNIQUE (stream_id, version) refuses them if n + 1 is taken. What the constraint cannot see is
    # a gap (n missing): so a point lookup of n ("exact"), or none ("new") when n = 0 (`no_stream`)
    # or n is already proven to exist (the store's known versions).
    exact = select(_p("stream_id", Text), _p("stream_type", Text), _p("n", BigInteger) + step, *values)
    if many:
        exact = exact.select_from(_batch)
    out["new"] = _compiled(_insert(exact, many), ("stream_id", "stream_type", "n", *value_order))
    has_n = exists().where(ev.stream_id == _p("n_stream"), ev.version == _p("n_version"))
    out["exact"] = _compiled(
        _insert(exact.where(has_n), many), ("stream_id", "stream_type", "n", *value_order, "n_stream", "n_version")
    )
    return out


INSERT_ONE = _modes(many=False)
INSERT_MANY = _modes(many=True)

BY_IDS = _compiled(select(*COLUMNS).where(ev.event_id == any_(_p("ids", ARRAY(UUID)))).order_by(ev.version), ("ids",))

# -- reads -------------------------------------------------------------------------------------------
READ_FWD = _compiled(
    select(*COLUMNS)
    .where(ev.stream_id == _p("stream_id"), ev.version >= _p("version"))
    .order_by(ev.version)
    .limit(_p("limit")),
    ("stream_id", "version", "limit"),
)
READ_BWD = _compiled(
    select(*COLUMNS)
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
    select(snapshots.c.version, snapshots.c.state)
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
    cast(null(), JSONB).label("metadata"),
    cast(null(), TIMESTAMP(timezone=True)).label("occurred_at"),
    cast(null(), TIMESTAMP(timezone=True)).label("recorded_at"),
)
_tail = select(*COLUMNS).where(
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
_after = (
    select(_prior.c.transaction_id, _prior.c.global_position)
    .where(_prior.c.global_position == _p("after"))
    .scalar_subquery()
)


def _read_all(*, typed: bool, from_start: bool, filtered: bool = False) -> str:
    query = select(*COLUMNS).where(ev.transaction_id < _xmin)
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
        query, order = query.where(tuple_(ev.transaction_id, ev.global_position) > _after), (*order, "after")
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
POSITION_EXISTS = _compiled(select(exists().where(ev.global_position == _p("position"))), ("position",))

# The streams of a type, by stream id (a partial index holds each stream's first event).
_stream = events.alias("stream")
_last = select(func.max(_stream.c.version)).where(_stream.c.stream_id == ev.stream_id).scalar_subquery()
STREAMS_OF_TYPE = _compiled(
    select(ev.stream_id, _last, ev.recorded_at)
    .where(ev.stream_type == _p("stream_type"), ev.version == _ONE, ev.stream_id > _p("after"))
    .order_by(ev.stream_id)
    .limit(_p("limit")),
    ("stream_type", "after", "limit"),
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
            "taken_at": func.now(),
        },
        where=snapshots.c.version < statement.excluded.version,
    )


SNAP_PUT = _compiled(_snap_put(pg_insert(snapshots).values(**{k: _p(k) for k in _SNAP_ORDER})), _SNAP_ORDER)
# The snapshot a command takes, sent with its append (same implicit transaction, same round trip):
# written only if that append's last event is stored, so a refused append leaves no snapshot.
_appended = exists().where(ev.stream_id == _p("ev_stream"), ev.version == _p("ev_version"), ev.event_id == _p("ev_id"))
SNAP_PUT_AFTER = _compiled(
    _snap_put(
        pg_insert(snapshots).from_select(
            list(_SNAP_ORDER),
            select(
                _p("stream_id", Text),
                _p("stream_type", Text),
                _p("version", BigInteger),
                cast(_p("state"), JSONB),
                _p("state_version", Integer),
            ).where(_appended),
        )
    ),
    (*_SNAP_ORDER, "ev_stream", "ev_version", "ev_id"),
)
