"""A small pass folded in the driver: the runner's steps 2–4 without a Spark job.

A continuous run mostly finds a handful of new records; a Spark job (plan, shuffle by unit,
tasks, results) costs far more than folding them. When a pass is small and the fold is a plain
one (no window, no tables, no truncates, nothing emitted), the driver reads the new records
itself, routes them with the same `engine` functions the Spark tasks run, folds the touched units
from their stored states and stages the output exactly as a task would (`job.stage_units`), then
commits with `Store.commit_folds` — the same tables, the same transaction. A unit that must be
recomputed from all its records (a new record ordered before its last one) hands the pass back to
Spark: `fold_small` returns None.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from tributary.eventstore.keys import DatabaseKeys, reveal_values
from tributary.projections.definition import Projection
from tributary.projections.engine import (
    Item,
    Prior,
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
from tributary.projections.source import RawRecord
from tributary.projections.store import BuildRow, Store

__all__ = ["RecordReader", "fold_small", "folds_small"]

TP = tuple[str, int]


class RecordReader(Protocol):
    """A log the driver can read records of (`LocalSource`, `KafkaSource`)."""

    def read(self, topic: str, partition: int, lo: int, hi: int) -> Iterator[RawRecord]:
        """The records of offsets [lo, hi) of one topic-partition, in offset order."""
        ...


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


def _records(log: RecordReader, lo: Mapping[TP, int], hi: Mapping[TP, int]) -> Iterable[RawRecord]:
    for tp in sorted(hi):
        if hi[tp] > lo.get(tp, 0):
            yield from log.read(tp[0], tp[1], lo.get(tp, 0), hi[tp])


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
) -> int | None:
    """Fold the records from `lo` to the `checkpoints`' offsets in the driver and commit them
    with those checkpoints, in one transaction (temporary staging tables, COPY,
    `Store.commit_folds`); returns the rows upserted, or None when a unit must be recomputed
    (nothing was written: the pass runs on Spark)."""
    store.upgrade_state(b)
    hi = {tp: end for tp, (end, _) in checkpoints.items()}
    items = _items(p, list(_records(log, lo, hi)), DatabaseKeys.on(store.conn))
    priors: dict[str, Prior] = {}
    if resumed:
        merged = merges_partitions(p)
        firsts = first_keys(items, merged)
        priors, recompute = decide(store.priors(b, list(firsts)), firsts, merged=merged)
        if recompute:
            return None
    items.sort(key=Item.order)
    outs = fold_units(p, items, priors, skip_errors=skip_errors)
    with store.conn.transaction():
        staged = store.staging(p, b, temp=True)
        summary = stage_units(store.conn, staged.tables, outs, staged.schema)
        return store.commit_folds(p, b, staged, [summary], checkpoints, records, truncates={})
