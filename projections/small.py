"""A small pass folded in the driver: the runner's steps 2–4 without a Spark job.

A continuous run mostly finds a handful of new records; a Spark job (plan, shuffle by unit,
tasks, results) costs far more than folding them. When a pass is small and the fold is a plain
one (no window, no tables, no truncates, nothing emitted), the driver reads the new records
itself, routes them with the same `engine` functions the Spark tasks run, folds the touched units
from their stored states and stages the output exactly as a task would (`job.stage_units`), then
commits with `Store.commit_folds` — the same tables, the same transaction. A unit that must be
recomputed from all its records (a new record ordered before its last one) hands the pass back to
Spark: `fold_small` returns None.

A continuous run passes a `StateCache`: the states of the units its small passes committed, kept
between passes (it holds the projection's lock, so the stored states are its own writes), so a
pass loads from the state table only the units it does not hold. The cache trusts itself only
while the build's checkpoints are where its last commit left them: another build, or any commit
it did not make (a Spark pass, another process while it was idle), empties it, as does any error.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

from tributary.eventstore.keys import DatabaseKeys, reveal_values
from tributary.projections.definition import Projection
from tributary.projections.engine import (
    Item,
    Prior,
    UnitOut,
    applies_truncates,
    decide,
    first_keys,
    fold_units,
    merges_partitions,
    plan_items,
    prepare,
)
from tributary.projections.job import stage_units
from tributary.projections.records import ProjectionRecord, decode
from tributary.projections.source import RawRecord, RecordReader, read_range
from tributary.projections.store import BuildRow, Staged, Store

__all__ = ["StateCache", "fold_small", "folds_small"]

TP = tuple[str, int]


def folds_small(p: Projection) -> bool:
    """Whether a pass of `p` may be folded in the driver: a plain fold, whose new records alone
    (with the units' stored states) decide its output."""
    return p.fold is not None and p.window is None and not p.tables and p.emit is None and not applies_truncates(p)


def _items(p: Projection, raw: Sequence[RawRecord], keys: DatabaseKeys) -> list[Item]:
    """Route records as a Spark task does: key and event time from the record as logged, the
    fold then sees its value with personal data revealed (`job._folder`)."""
    recs = [prepare(p, decode(*r)) for r in raw]
    values = reveal_values(keys, [r.topic for r in recs], [r.value for r in recs])
    out: list[Item] = []
    for rec, value in zip(recs, values, strict=True):
        for it in plan_items(p, rec, None):
            shown = rec if value is rec.value else _with_value(rec, value)
            out.append(Item(it.unit, it.key, None, None, True, shown))
    return out


def _with_value(rec: ProjectionRecord, value: object) -> ProjectionRecord:
    return ProjectionRecord(
        rec.topic, rec.partition, rec.offset, rec.timestamp, rec.key, value, rec.headers, rec.event_time, rec.joined
    )


class StateCache:
    """Units' committed states between the small passes of one continuous run: a bounded LRU
    (`limit` units, 0 = off) valid for one build at the checkpoints of its last commit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.build: tuple[str, int] | None = None
        self.at: dict[TP, int] | None = None  # the checkpoints the cached states were committed with
        self.units: OrderedDict[str, Prior] = OrderedDict()
        self.staged: Staged | None = None  # the session's staging tables for `build` (the Store made them)
        self.upgraded = False  # `Store.upgrade_state` done for `build`

    def clear(self) -> None:
        """Forget everything: after an error, a reconnect, or a commit made elsewhere."""
        self.build, self.at, self.staged, self.upgraded = None, None, None, False
        self.units.clear()

    def check(self, b: BuildRow, lo: Mapping[TP, int]) -> None:
        """Keep the cache only for the build it was filled for, still at the checkpoints its last
        commit wrote (`lo`: the checkpoints this pass starts from); else start afresh."""
        if self.build != (b.projection, b.build) or self.at != dict(lo):
            self.clear()
            self.build = (b.projection, b.build)

    def take(self, units: Iterable[str]) -> tuple[dict[str, Prior], list[str]]:
        """The cached priors of `units`, and the units to load from the state table."""
        found: dict[str, Prior] = {}
        missing: list[str] = []
        for u in units:
            prior = self.units.get(u)
            if prior is None:
                missing.append(u)
            else:
                found[u] = prior
                self.units.move_to_end(u)
        return found, missing

    def committed(self, outs: Iterable[UnitOut], at: Mapping[TP, int]) -> None:
        """A pass committed `outs` with checkpoints `at`: they are the stored states now."""
        self.at = dict(at)
        if self.limit <= 0:
            return
        for o in outs:
            self.units[o.unit] = Prior(o.state, o.last, o.pks, o.dropped, False, o.tps or ())
            self.units.move_to_end(o.unit)
        while len(self.units) > self.limit:
            self.units.popitem(last=False)


def _stored(store: Store, b: BuildRow, units: list[str], cache: StateCache | None) -> dict[str, Prior]:
    """The stored priors of `units`: those the cache holds, the rest from the state table."""
    if cache is None:
        return store.priors(b, units)
    found, missing = cache.take(units)
    if missing:
        found.update(store.priors(b, missing))
    return found


def fold_small(
    store: Store,
    log: RecordReader,
    p: Projection,
    b: BuildRow,
    *,
    lo: Mapping[TP, int],
    checkpoints: Mapping[TP, tuple[int, int | None]],
    records: int,
    resumed: bool,
    skip_errors: bool,
    cache: StateCache | None = None,
) -> int | None:
    """Fold the records from `lo` to the `checkpoints`' offsets in the driver and commit them
    with those checkpoints, in one transaction (temporary staging tables, COPY,
    `Store.commit_folds`); returns the rows upserted, or None when a unit must be recomputed
    (nothing was written: the pass runs on Spark). `cache`: a continuous run's states kept
    between passes, and its session's staging tables (made once, emptied by each commit)."""
    if cache is not None:
        cache.check(b, lo)
    if cache is None or not cache.upgraded:
        store.upgrade_state(b)
        if cache is not None:
            cache.upgraded = True
    hi = {tp: end for tp, (end, _) in checkpoints.items()}
    items = _items(p, list(read_range(log, lo, hi)), DatabaseKeys.on(store.conn))
    priors: dict[str, Prior] = {}
    if resumed:
        merged = merges_partitions(p)
        firsts = first_keys(items, merged)
        priors, recompute = decide(_stored(store, b, list(firsts), cache), firsts, merged=merged)
        if recompute:
            return None
    items.sort(key=Item.order)
    outs = list(fold_units(p, items, priors, skip_errors=skip_errors))
    with store.conn.transaction():
        if cache is None:
            staged = store.staging(p, b, temp=True)
        else:
            # a continuous run's commit need not wait for the WAL flush (milliseconds on a busy disk): a
            # database crash may lose its last passes, checkpoints with them, and the next pass redoes them
            store.conn.execute("SET LOCAL synchronous_commit = off")
            staged = cache.staged = cache.staged or store.session_staging(p, b)
        summary = stage_units(store.conn, staged.tables, outs, staged.schema)
        rows = store.commit_folds(p, b, staged, [summary], checkpoints, records, truncates={})
    if cache is not None:  # committed: these are the stored states now
        cache.committed(outs, hi)
    return rows
