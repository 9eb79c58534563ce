"""The fold engine, pure: route records to units, fold each unit's records in order, emit rows.

A *unit* is what one fold state belongs to: the key (plain folds, session windows) or the
(key, window start) pair (tumbling/hopping). The runner feeds `fold_units` items in log order,
sorted by (unit, topic, partition, offset) — in a Spark task or in one process, the same code —
and `fold_order` puts each unit's items in the order its fold applies them: never reordered
within a topic-partition (log order is commit order); event time only picks which
topic-partition's head goes next, earliest first, tie-break (topic, partition, offset). That
k-way merge equals a sort by each item's *order key* (the max event time of the unit's items on
its topic-partition up to it, topic, partition, offset), a function of the log alone. Session
windows are the exception: their gap rule is defined on event time, so they fold in (event time,
topic, partition, offset) order.

A unit either *resumes* from its stored state (every new record orders after the last one it
saw, so state + new records = the fold over everything) or is *recomputed* from all of its
records; either way the result equals a rebuild's (see runner.py for who decides).

Truncates (a CDC `op: "t"` record, no key, one copy on every partition of the table's topic)
reach the units of a plain fold over a CDC topic by delivery, not by key: a truncate on a
topic-partition is applied to every unit with a record on that topic-partition between the
previous truncate there and this one (by offset), at its place in the unit's order. So a mirror's
rows whose last change precedes the truncate go, rows changed after it stay, and a key already
truncated is not reached again. Each unit keeps the topic-partitions it has records on since their
last truncate (`tps`), so an incremental run reaches units it has no new records for; a new record
always follows the truncates an earlier run delivered on its topic-partition (offsets), so it
never reopens them. Windowed folds see a truncate as a keyless record.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from functools import lru_cache
from itertools import groupby
from typing import Any, Protocol

import orjson

from tributary.projections.codec import FoldState, canonical, copy_line, copy_text, dump_state, load_state
from tributary.projections.definition import Projection, Table
from tributary.projections.errors import DefinitionError, RecordError
from tributary.projections.records import ProjectionRecord, SortKey, sort_key
from tributary.projections.windows import admit, assign, watermark

__all__ = [
    "Emitted",
    "Item",
    "Late",
    "Prior",
    "UnitOut",
    "applies_truncates",
    "decide",
    "deliver_truncates",
    "first_keys",
    "fold_order",
    "late_records",
    "fold_units",
    "merges_partitions",
    "plan_items",
    "prepare",
    "reaches",
    "unit_key",
    "recompute_items",
    "render_row",
    "truncate_items",
    "truncate_points",
]

Pk = tuple[str | None, ...]
TP = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Item:
    """One record routed to one unit; `admitted` False = late under the window's policy."""

    unit: str
    key: str
    start: int | None
    end: int | None
    admitted: bool
    record: ProjectionRecord
    watermark: int | None = None  # what judged it (windowed folds): its partition's max before − lateness

    def order(self) -> tuple[str, str, int, int]:
        """Log order within the unit: what `fold_units` expects its input sorted by."""
        r = self.record
        return (self.unit, r.topic, r.partition, r.offset)


@dataclass(frozen=True, slots=True)
class Prior:
    """What the state table holds for a unit; `resume` says whether to continue from it.
    `last`: the order key (`fold_order`) of the last item the unit saw."""

    state: str | None
    last: SortKey | None
    pks: tuple[Pk, ...]
    dropped: int
    resume: bool
    tps: tuple[TP, ...] = ()


Emitted = tuple[str, int, int, int, str, str | None, int]
"""One record a fold emits: (source topic, partition, offset, index among that record's emits,
key as canonical JSON, value as JSON or None for a tombstone, the source record's timestamp)."""


@dataclass(frozen=True, slots=True)
class UnitOut:
    """A folded unit: new state, the rows it now owns (`pks`), rows to upsert and to delete."""

    unit: str
    state: str
    last: SortKey | None
    pks: tuple[Pk, ...]
    rows: tuple[str, ...]
    deletes: tuple[Pk, ...]
    dropped: int
    errors: tuple[tuple[str, int, int, str], ...] = ()
    tps: tuple[TP, ...] | None = None  # topic-partitions it has records on (folds that apply truncates)
    emits: tuple[Emitted, ...] = ()  # what `Projection.emit` returned for the records applied from `since`


def prepare(p: Projection, record: ProjectionRecord) -> ProjectionRecord:
    """Apply the projection's own event-time function, if it has one (not to its tables'
    records: those keep the log's event time, so a function written for its topics need not
    know them)."""
    if p.event_time is None or p.is_table(record.topic):
        return record
    try:
        return replace(record, event_time=int(p.event_time(record)))
    except Exception as exc:
        raise RecordError(
            p.name,
            record.topic,
            record.partition,
            record.offset,
            f"event_time: {type(exc).__name__}: {exc}",
        ) from exc


def unit_key(p: Projection, record: ProjectionRecord) -> str | None:
    """The record's fold key as canonical JSON, or None when the projection's `key` function
    returned None for it: the record is dropped. A truncate is never dropped (it is delivered by
    topic-partition, or routed to the key `null` of a windowed fold)."""
    if p.key is None or p.is_table(record.topic):  # a table's records are looked up by their log key
        return canonical(record.key)
    try:
        key = p.key(record)
    except Exception as exc:  # user code: say which record
        raise RecordError(
            p.name, record.topic, record.partition, record.offset, f"key: {type(exc).__name__}: {exc}"
        ) from exc
    if key is None and not record.is_truncate:
        return None
    return canonical(key)


def reaches(p: Projection, record: ProjectionRecord) -> bool:
    """Whether the projection sees the record at all: schema records only when it asked for
    them (`schema_records=True`), and not a record its `key` function gave None."""
    if (record.is_schema and not p.schema_records) or p.is_table(record.topic):
        return False
    return p.key is None or unit_key(p, record) is not None


def plan_items(p: Projection, record: ProjectionRecord, max_before: int | None) -> list[Item]:
    """Route a record: its key, its window(s) and whether the watermark still admits it.

    `max_before` is the max event time of the records before it in its topic-partition."""
    w = p.window
    if (record.is_schema and not p.schema_records) or p.is_table(record.topic):
        return []
    if w is None and record.key is None and record.is_truncate and applies_truncates(p):
        return []  # delivered to units by `deliver_truncates`, not routed by key
    key = unit_key(p, record)
    if key is None:
        return []
    if w is None:
        return [Item(key, key, None, None, True, record)]
    wm = watermark(max_before, w.lateness)
    t = record.event_time
    if w.kind == "session":
        return [Item(key, key, None, None, admit(w, t + w.gap, wm), record, wm)]
    return [Item(canonical([orjson.loads(key), s]), key, s, e, admit(w, e, wm), record, wm) for s, e in assign(w, t)]


@dataclass(frozen=True, slots=True)
class Late:
    """A record past its window's lateness, kept with why (Flink's late-data side output).

    `window_start`/`window_end`: the window it was late for (a session: the `[t, t + gap)` it
    would open); `reason`: `closed` (policy drop: the watermark reached the window's end) or
    `past_grace` (policy update: the watermark is `grace` or more past the end)."""

    topic: str
    partition: int
    offset: int
    window_start: int
    window_end: int
    watermark: int
    event_time: int
    reason: str
    key: str
    value: str | None

    def ident(self) -> tuple[str, int, int, int]:
        """What a late record is stored under: a record is late once per window, whichever run saw it."""
        return (self.topic, self.partition, self.offset, self.window_start)


def late_records(p: Projection, items: Iterable[Item]) -> list[Late]:
    """The late output of routed items: one entry per item its window's policy did not admit.
    A function of each record and its partition's watermark alone, so any split into runs
    gives the same set as a rebuild."""
    w = p.window
    if w is None:
        return []
    out: list[Late] = []
    for it in items:
        if it.admitted or it.watermark is None:
            continue
        r = it.record
        start, end = (r.event_time, r.event_time + w.gap) if it.start is None else (it.start, it.end or 0)
        value = None if r.value is None else orjson.dumps(r.value).decode()
        reason = "closed" if w.late == "drop" else "past_grace"
        out.append(Late(r.topic, r.partition, r.offset, start, end, it.watermark, r.event_time, reason, it.key, value))
    return out


def applies_truncates(p: Projection) -> bool:
    """Truncates are delivered to the units of plain (unwindowed) folds over a CDC topic."""
    return p.fold is not None and p.window is None and any(not t.startswith("events.") for t in p.topics)


def truncate_items(truncates: Iterable[ProjectionRecord], holders: Mapping[TP, Iterable[str]]) -> list[Item]:
    """One item per (truncate, unit holding records on the truncate's topic-partition); the fold
    skips those that find no record of the unit there since the previous truncate."""
    return [
        Item(unit, unit, None, None, True, r)
        for r in truncates
        for unit in sorted(holders.get((r.topic, r.partition), ()))
    ]


def _holders(items: Iterable[Item]) -> dict[TP, set[str]]:
    out: dict[TP, set[str]] = {}
    for it in items:
        out.setdefault((it.record.topic, it.record.partition), set()).add(it.unit)
    return out


def deliver_truncates(
    new_items: Sequence[Item],
    truncates: Sequence[ProjectionRecord],
    stored: Mapping[str, Prior],
) -> list[Item]:
    """An incremental run's items with its truncates delivered — to the units of its new records
    and to stored units with records on the truncate's topic-partition since the last truncate
    there (`Prior.tps`). A new record follows every truncate an earlier run saw on its
    topic-partition (offsets), so no earlier delivery needs redoing."""
    holders = _holders(new_items)
    wanted = {(r.topic, r.partition) for r in truncates}
    for unit, prior in stored.items():
        for tp in prior.tps:
            if tp in wanted:
                holders.setdefault(tp, set()).add(unit)
    return [*new_items, *truncate_items(truncates, holders)]


def recompute_items(
    all_items: Iterable[Item], all_truncates: Iterable[ProjectionRecord], recompute: Collection[str]
) -> list[Item]:
    """Every item of the units to recompute, truncates of the whole log delivered to them."""
    items = [i for i in all_items if i.unit in recompute]
    return [*items, *truncate_items(all_truncates, _holders(items))]


class TruncateAt(Protocol):
    """Where a truncate is: a `ProjectionRecord`, or a Spark row of its columns."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def event_time(self) -> int: ...


def truncate_points(points: Mapping[TP, tuple[int, int]], truncates: Iterable[TruncateAt]) -> dict[TP, tuple[int, int]]:
    """Each topic-partition's latest truncate (by offset), as (event time, offset), after these
    truncates: kept with the checkpoints, so a build shows where its tables were last truncated."""
    out = dict(points)
    for r in truncates:
        tp, at = (r.topic, r.partition), (r.event_time, r.offset)
        if tp not in out or at[1] > out[tp][1]:
            out[tp] = at
    return out


Layout = tuple[tuple[str, ...], frozenset[str], tuple[int, ...]]
_LAYOUTS: dict[int, tuple[Table, Layout]] = {}


@lru_cache(maxsize=64)
def _layout(table: Table) -> Layout:
    names = table.names
    return names, frozenset(names), tuple(names.index(k) for k in table.primary_key)


def _layout_of(table: Table) -> Layout:
    """`_layout` by the table object's identity first: hashing a `Table` (every column) for each
    row cost more than rendering it."""
    hit = _LAYOUTS.get(id(table))
    if hit is None or hit[0] is not table:
        if len(_LAYOUTS) >= 64:
            _LAYOUTS.clear()
        hit = _LAYOUTS[id(table)] = (table, _layout(table))
    return hit[1]


def render_row(p: Projection, row: Mapping[str, Any]) -> tuple[str, Pk]:
    """A result row → (COPY line in column order, its primary key as rendered text)."""
    names, known, pk_at = _layout_of(p.table)
    if not known.issuperset(row):
        raise DefinitionError(f"projection {p.name!r} returned unknown columns {sorted(set(row) - known)}")
    values = [copy_text(row.get(n)) for n in names]
    pk = tuple(values[i] for i in pk_at)
    if any(v is None for v in pk):
        raise DefinitionError(f"projection {p.name!r} returned a row with a NULL primary key: {row}")
    return copy_line(values), pk


def _apply(p: Projection, state: FoldState, item: Item, errors: list[tuple[str, int, int, str]] | None) -> FoldState:
    """Apply user code; on error stop with the record's position, or (skip-errors) note it for
    the dead-letter table and keep the state as it was."""
    r = item.record
    assert p.fold is not None
    try:
        return p.fold.apply(state, r)
    except Exception as exc:  # user code: report where, never swallow
        if errors is None:
            raise RecordError(p.name, r.topic, r.partition, r.offset, f"{type(exc).__name__}: {exc}") from exc
        errors.append((r.topic, r.partition, r.offset, f"{type(exc).__name__}: {exc}"))
        return state


def _call(p: Projection, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:
        raise DefinitionError(
            f"projection {p.name!r}: {fn.__name__}{args!r} raised {type(exc).__name__}: {exc}"
        ) from exc


def merges_partitions(p: Projection) -> bool:
    """Whether the fold follows the per-partition merge (`fold_order`); session windows fold in
    event-time order instead, as their gap rule is defined on sorted event times."""
    return p.window is None or p.window.kind != "session"


def fold_order(
    items: Iterable[Item], last: SortKey | None = None, seen: set[TP] | None = None
) -> list[tuple[SortKey, Item]]:
    """A unit's items (in log order, `Item.order`) in the order its fold applies them, each with
    its order key (max event time on its topic-partition so far, topic, partition, offset).

    Sorting by that key is the k-way merge of the unit's per-topic-partition runs by their heads'
    event time, so records are never reordered within a topic-partition. `last`: the order key
    of the last item a resumed unit saw (its run continues from that max). `seen` (folds that
    apply truncates): the topic-partitions the unit has records on since their last truncate,
    updated in place; a truncate with no record of the unit before it there is left out."""
    top: dict[TP, int] = {} if last is None else {(last[1], last[2]): last[0]}
    keyed: list[tuple[SortKey, Item]] = []
    runs = 0
    prev: TP | None = None
    for item in items:
        r = item.record
        tp = (r.topic, r.partition)
        if seen is not None:
            if not r.is_truncate:
                seen.add(tp)
            elif tp in seen:
                seen.discard(tp)  # already truncated: the next truncate there has nothing to remove
            else:
                continue  # no record of this unit on that topic-partition since the last truncate
        if tp != prev:
            runs, prev = runs + 1, tp
        m = top.get(tp)
        if m is None or r.event_time > m:
            m = top[tp] = r.event_time
        keyed.append(((m, r.topic, r.partition, r.offset), item))
    if runs > 1:  # one run is already in order: its keys never decrease
        keyed.sort(key=_first)
    return keyed


def _first(pair: tuple[SortKey, Item]) -> SortKey:
    return pair[0]


def first_keys(items: Iterable[Item], merged: bool) -> dict[str, list[SortKey]]:
    """Per unit, what `decide` compares with its stored `last`: the sort key of its first new
    item on each topic-partition (`merged`, see `merges_partitions`), else of its earliest."""
    out: dict[str, dict[TP, SortKey]] = {}
    for it in items:
        r = it.record
        k = sort_key(r)
        tp = (r.topic, r.partition) if merged else ("", 0)
        per = out.setdefault(it.unit, {})
        cur = per.get(tp)
        if cur is None or (r.offset < cur[3] if merged else k < cur):
            per[tp] = k
    return {u: sorted(per.values()) for u, per in out.items()}


def _decimal_text(obj: object) -> str:
    """Emitted JSON: a Decimal is written as its exact text (as capture writes numerics)."""
    if isinstance(obj, Decimal):
        return format(obj, "f")
    raise TypeError(f"{type(obj).__name__} is not JSON-able")


def _out_json(value: object) -> str:
    """An emitted key or value as JSON text, keys sorted: equal values are equal bytes."""
    return orjson.dumps(value, default=_decimal_text, option=orjson.OPT_SORT_KEYS).decode()


def emits_of(p: Projection, state: FoldState, record: ProjectionRecord) -> list[Emitted]:
    """`Projection.emit` after `record` was applied: its pairs, keys canonical and values as JSON,
    so that equal outputs are equal bytes on every run."""
    assert p.emit is not None
    r = record
    try:
        pairs = list(p.emit.records(state, record))
        return [
            (r.topic, r.partition, r.offset, i, _out_json(k), None if v is None else _out_json(v), r.timestamp)
            for i, (k, v) in enumerate(pairs)
        ]
    except Exception as exc:
        raise RecordError(
            p.name, record.topic, record.partition, record.offset, f"emit: {type(exc).__name__}: {exc}"
        ) from exc


def _fold_plain(
    p: Projection,
    unit: str,
    items: Sequence[Item],
    prior: Prior | None,
    errors: list[tuple[str, int, int, str]] | None,
    since: Mapping[TP, int] | None = None,
) -> UnitOut:
    assert p.fold is not None
    first = items[0]
    emits: list[Emitted] = []
    win = () if first.start is None else (first.start, first.end)
    tracking = applies_truncates(p)
    if prior is not None and prior.resume:
        state, last, dropped = load_state(prior.state), prior.last, prior.dropped
        seen = set(prior.tps)
    else:
        state, last, dropped = _call(p, p.fold.initial, orjson.loads(first.key), *win), None, 0
        seen = set()
    for key, item in fold_order(items, last, seen if tracking else None):
        last = key  # what the unit has seen, applied or not: a new record ordered before it recomputes
        if not item.admitted:
            dropped += 1
            continue
        state = _apply(p, state, item, errors)
        r = item.record
        if p.emit is not None and r.offset >= (since or {}).get((r.topic, r.partition), 0):
            emits += emits_of(p, state, r)
    row = _call(p, p.fold.result, state, *win)
    rows: tuple[str, ...] = ()
    pks: tuple[Pk, ...] = ()
    if row is not None:
        line, pk = render_row(p, row)
        rows, pks = (line,), (pk,)
    old = prior.pks if prior is not None else ()
    return UnitOut(
        unit,
        dump_state(state),
        last,
        pks,
        rows,
        tuple(k for k in old if k not in pks),
        dropped,
        tuple(errors or ()),
        tuple(sorted(seen)) if tracking else None,
        tuple(emits),
    )


def _fold_session(
    p: Projection,
    unit: str,
    items: Sequence[Item],
    prior: Prior | None,
    errors: list[tuple[str, int, int, str]] | None,
) -> UnitOut:
    assert p.fold is not None and p.window is not None
    fold, gap, key = p.fold, p.window.gap, orjson.loads(items[0].key)
    old = prior.pks if prior is not None else ()
    cur: list[Any] | None = None
    kept: list[Pk] = []
    last, dropped = None, 0
    if prior is not None and prior.resume:
        cur, last, dropped = load_state(prior.state), prior.last, prior.dropped
        kept = list(old[:-1]) if cur is not None else list(old)  # the open session owns the last pk
    rows: list[str] = []
    ordered = sorted(items, key=lambda i: sort_key(i.record))  # sessions: event-time order

    def close(c: list[Any]) -> None:
        row = _call(p, fold.result, c[2], c[0], c[1])
        if row is not None:
            line, pk = render_row(p, row)
            rows.append(line)
            kept.append(pk)

    for item in ordered:
        if not item.admitted:
            dropped += 1
            continue
        t = item.record.event_time
        if cur is None or t >= cur[1]:
            if cur is not None:
                close(cur)
            cur = [t, t + gap, _call(p, p.fold.initial, key, t, t + gap)]
        cur[2] = _apply(p, cur[2], item, errors)
        cur[1] = max(cur[1], t + gap)
        last = sort_key(item.record)
    if cur is not None:
        close(cur)
    pks = tuple(kept)
    return UnitOut(
        unit,
        dump_state(cur),
        last,
        pks,
        tuple(rows),
        tuple(k for k in old if k not in pks),
        dropped,
        tuple(errors or ()),
    )


def fold_units(
    p: Projection,
    items: Iterable[Item],
    priors: Mapping[str, Prior],
    *,
    skip_errors: bool = False,
    since: Mapping[TP, int] | None = None,
) -> Iterator[UnitOut]:
    """Fold items sorted by `Item.order()` (log order per unit); one output per unit, in the
    order units arrive.
    `skip_errors`: records the fold raises on are reported in `UnitOut.errors`, not fatal.
    `since` (projections that emit): per topic-partition, the first offset whose records emit —
    records below it were emitted by an earlier run (a recomputed unit refolds them silently)."""
    if p.fold is None:
        raise DefinitionError(f"projection {p.name!r} is a DataFrame transform, not a fold")
    session = p.window is not None and p.window.kind == "session"
    for unit, group in groupby(items, key=lambda i: i.unit):
        errors: list[tuple[str, int, int, str]] | None = [] if skip_errors else None
        if session:
            yield _fold_session(p, unit, list(group), priors.get(unit), errors)
        else:
            yield _fold_plain(p, unit, list(group), priors.get(unit), errors, since)


def decide(
    stored: Mapping[str, Prior],
    firsts: Mapping[str, Collection[SortKey]],
    force: Collection[str] = (),
    *,
    merged: bool = True,
) -> tuple[dict[str, Prior], set[str]]:
    """For the units new records touch: resume those whose new records all order after the last
    item they saw; the others are recomputed from all their records, as are the units in
    `force`. `firsts` comes from `first_keys`: with the per-partition merge (`merged`), a first
    new item on the topic-partition of `last` always follows it (offsets; its order key is at
    least `last`'s), and one on another topic-partition follows it when its sort key is greater
    (its order key is then its own event time). Returns (priors for the fold, units to
    recompute)."""
    priors: dict[str, Prior] = {}
    recompute: set[str] = set(force)
    for unit, keys in firsts.items():
        prior = stored.get(unit)
        if prior is None:
            continue
        last = prior.last
        resume = unit not in recompute and (
            last is None or all(k > last or (merged and k[1:3] == last[1:3]) for k in keys)
        )
        priors[unit] = Prior(prior.state, prior.last, prior.pks, prior.dropped, resume, prior.tps)
        if not resume:
            recompute.add(unit)
    return priors, recompute
