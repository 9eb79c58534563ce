"""The runner's protocol in one process, over in-memory partitions: the reference the Spark
runner is tested against, the single-process baseline of the benchmark, and what the property
test drives (random logs, random run boundaries, one rebuild: equal tables).

Steps of one incremental run (the Spark runner takes the same ones, distributed):
 1. new records = each topic-partition from its checkpoint to its end; watermarks continue
    from the partition's stored max event time;
 2. route them to units, and find each touched unit's first new record per topic-partition;
 3. `decide`: resume a unit from its stored state, or recompute it from all its records;
 4. fold (recomputed units over all their records, the others over the new ones);
 5. apply: delete rows units gave up, upsert their rows, store states and checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tributary.projections.definition import Projection
from tributary.projections.engine import (
    Emitted,
    Item,
    Late,
    Prior,
    UnitOut,
    applies_truncates,
    decide,
    deliver_truncates,
    first_keys,
    fold_units,
    late_records,
    merges_partitions,
    plan_items,
    prepare,
    reaches,
    recompute_items,
)
from tributary.projections.joins import (
    TableIndex,
    enrich,
    frontier,
    late_table_record,
    order_time,
    order_times,
    table_index,
)
from tributary.projections.records import ProjectionRecord, SortKey
from tributary.projections.windows import running_max_before

__all__ = ["LocalView", "run_local"]

TP = tuple[str, int]


@dataclass
class LocalView:
    """A derived table with its state table and checkpoints, held in memory."""

    checkpoints: dict[TP, int] = field(default_factory=dict)
    maxes: dict[TP, int | None] = field(default_factory=dict)
    states: dict[str, Prior] = field(default_factory=dict)
    rows: dict[tuple[str | None, ...], str] = field(default_factory=dict)
    dead: dict[tuple[str, int, int], str] = field(default_factory=dict)
    late: dict[tuple[str, int, int, int], Late] = field(default_factory=dict)
    emitted: list[Emitted] = field(default_factory=list)  # the derived stream (`Projection.emit`), in emit order

    def table(self) -> list[str]:
        """The table's rows as COPY lines, ordered by primary key."""
        return [self.rows[k] for k in sorted(self.rows, key=lambda k: [(v is None, v or "") for v in k])]


def _items(
    p: Projection, records: Sequence[ProjectionRecord], base: int | None, index: TableIndex | None = None
) -> list[Item]:
    recs = [r for r in (prepare(p, r) for r in records) if reaches(p, r)]
    befores = running_max_before((r.event_time for r in recs), base)
    if p.tables:  # each record looks its tables up as of its order key (joins.py)
        assert index is not None
        recs = [enrich(p, r, order_time(mb, r), index) for r, mb in zip(recs, befores, strict=True)]
    return [i for r, mb in zip(recs, befores, strict=True) for i in plan_items(p, r, mb)]


def apply_outputs(view: LocalView, outs: list[UnitOut]) -> None:
    for out in outs:
        for pk in out.deletes:
            view.rows.pop(pk, None)
        for line, pk in zip(out.rows, out.pks[len(out.pks) - len(out.rows) :], strict=True):
            view.rows[pk] = line
        view.states[out.unit] = Prior(out.state, out.last, out.pks, out.dropped, False, out.tps or ())
        for topic, part, off, err in out.errors:
            view.dead[(topic, part, off)] = err


def run_local(
    p: Projection,
    log: Mapping[TP, Sequence[ProjectionRecord]],
    view: LocalView,
    *,
    skip_errors: bool = False,
) -> int:
    """One incremental run over `log` (each partition's committed records in offset order).
    Returns how many new records it read."""
    new_items: list[Item] = []
    seen = 0
    truncates = applies_truncates(p)
    new_truncates: list[ProjectionRecord] = []
    index, late_table = _tables(p, log, view)
    for tp, records in log.items():
        start = view.checkpoints.get(tp, 0)
        fresh = [r for r in records if r.offset >= start]
        seen += len(fresh)
        if p.is_table(tp[0]):
            continue
        new_items += _items(p, fresh, view.maxes.get(tp), index)
        new_truncates += [prepare(p, r) for r in fresh if truncates and r.is_truncate]
    for entry in late_records(p, new_items):
        view.late[entry.ident()] = entry
    if truncates:
        new_items = deliver_truncates(new_items, new_truncates, view.states)
    merged = merges_partitions(p)
    firsts: dict[str, list[SortKey]] = first_keys(new_items, merged)
    force: set[str] = set()
    if late_table:  # a table record ordered before records already applied: recompute every unit
        force = set(view.states)
        firsts = {**dict.fromkeys(force, []), **firsts}
    priors, recompute = decide(view.states, firsts, force, merged=merged)
    items = [i for i in new_items if i.unit not in recompute]
    if recompute:
        own = [rs for tp, rs in log.items() if not p.is_table(tp[0])]
        everything = [i for records in own for i in _items(p, records, None, index)]
        every_truncate = [prepare(p, r) for rs in log.values() for r in rs if truncates and r.is_truncate]
        items += recompute_items(everything, every_truncate, recompute)
    items.sort(key=Item.order)
    since = dict(view.checkpoints)  # records before the checkpoints emitted in an earlier run
    outs = list(fold_units(p, items, priors, skip_errors=skip_errors, since=since))
    view.emitted += sorted(e for out in outs for e in out.emits)
    apply_outputs(view, outs)
    for tp, records in log.items():
        if records:
            view.checkpoints[tp] = records[-1].offset + 1
            top = max(r.event_time for r in (prepare(p, r) for r in records))
            view.maxes[tp] = top
    return seen


def _tables(
    p: Projection, log: Mapping[TP, Sequence[ProjectionRecord]], view: LocalView
) -> tuple[TableIndex | None, bool]:
    """The projection's tables indexed over the whole log, and whether a new table record orders
    before a record the view already applied (`joins.late_table_record`)."""
    if not p.tables:
        return None, False
    keyed: list[tuple[SortKey, ProjectionRecord]] = []
    first_new: list[SortKey] = []
    for tp, records in log.items():
        if not p.is_table(tp[0]):
            continue
        start = view.checkpoints.get(tp, 0)
        firsts = 0
        for r, t in zip(records, order_times(r.event_time for r in records), strict=True):
            keyed.append(((t, *tp, r.offset), r))
            if r.offset >= start and not firsts:  # later ones order after it
                firsts = 1
                first_new.append(keyed[-1][0])
    applied = frontier(p, view.checkpoints, view.maxes)
    return table_index(keyed), late_table_record(first_new, applied)
