"""Stream–table joins made replayable: a fold's record looks up its tables' rows as of its place
in the merge order, a function of the log alone.

The merge order across all the topics a projection reads (its own and its tables') is the one a
fold already uses within a key (`engine.fold_order`), applied to the whole log: each record's
*order key* is (the max event time of its topic-partition up to and including it, topic,
partition, offset). Sorting by it is the k-way merge of every topic-partition by its head's event
time, never reordering a topic-partition. A table record is visible to a fold record when its
order key is smaller (Kafka Streams' KStream–KTable join gives "the table as of the stream
record"; here "as of" is defined by the log, not by when a run happened to read it).

A table's row for a key: a CDC topic's current row (`cdc.apply_change`: TOAST resolved, a delete
gives None, a truncate clears the keys whose last change is on its topic-partition); an event
topic's latest value (a tombstone gives None).

Incremental runs: a new fold record looks up the whole table history. A new table record whose
order key is below the last fold record already applied (a *late* table record) could change
what an applied record saw: `late_table_record` tells the runner, which then recomputes every
unit — so incremental runs still equal a rebuild.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from tributary.jsonvalue import JsonValue
from tributary.projections.cdc import apply_change
from tributary.projections.codec import canonical
from tributary.projections.definition import Projection
from tributary.projections.errors import RecordError
from tributary.projections.records import ProjectionRecord, SortKey

__all__ = [
    "TableIndex",
    "enrich",
    "frontier",
    "late_table_record",
    "order_key",
    "order_time",
    "order_times",
    "table_index",
]

TP = tuple[str, int]


def order_times(event_times: Iterable[int], base: int | None = None) -> list[int]:
    """For records of one topic-partition in offset order: the max event time up to and including
    each (continuing from `base`, the max before them)."""
    out: list[int] = []
    cur = base
    for t in event_times:
        cur = t if cur is None or t > cur else cur
        out.append(cur)
    return out


def order_time(max_before: int | None, record: ProjectionRecord) -> int:
    """A record's order time from its partition's max event time before it (`max_before`)."""
    return record.event_time if max_before is None else max(max_before, record.event_time)


def order_key(order_time: int, record: ProjectionRecord) -> SortKey:
    """A record's place in the merge order across every topic-partition the projection reads."""
    return (order_time, record.topic, record.partition, record.offset)


@dataclass(slots=True)
class _History:
    """One key's rows of one table, in merge order: what `lookup` bisects."""

    at: list[SortKey] = field(default_factory=list)
    rows: list[JsonValue] = field(default_factory=list)


@dataclass(slots=True)
class TableIndex:
    """Every table topic's rows by key through the log, in merge order (picklable: Spark
    broadcasts it to the tasks, as a GlobalKTable is copied to every Kafka Streams instance)."""

    topics: dict[str, dict[str, _History]] = field(default_factory=dict)

    def lookup(self, topic: str, key: str, at: SortKey) -> JsonValue:
        """The row of `key` (canonical JSON) in `topic` just before order key `at`, or None."""
        hist = self.topics.get(topic, {}).get(key)
        if hist is None:
            return None
        i = bisect_left(hist.at, at)
        return None if i == 0 else hist.rows[i - 1]


def table_index(keyed: Iterable[tuple[SortKey, ProjectionRecord]]) -> TableIndex:
    """The index of table records given with their order keys (any order; sorted here)."""
    index = TableIndex()
    current: dict[str, dict[str, tuple[JsonValue, TP]]] = {}
    for at, r in sorted(keyed, key=_first):
        if r.is_schema:
            continue
        table = index.topics.setdefault(r.topic, {})
        now = current.setdefault(r.topic, {})
        tp = (r.topic, r.partition)
        if r.is_truncate:  # clears the keys whose last change is on its topic-partition
            for key, (held, where) in list(now.items()):
                if where == tp and held is not None:
                    now[key] = (None, tp)
                    _append(table, key, at, None)
            continue
        key = canonical(r.key)
        prev = now.get(key, (None, tp))[0]
        row = r.value if r.is_event else apply_change(prev if isinstance(prev, dict) else None, r)
        now[key] = (row, tp)
        _append(table, key, at, row)
    return index


def _append(table: dict[str, _History], key: str, at: SortKey, row: JsonValue) -> None:
    hist = table.setdefault(key, _History())
    hist.at.append(at)
    hist.rows.append(row)


def _first(pair: tuple[SortKey, ProjectionRecord]) -> SortKey:
    return pair[0]


def enrich(p: Projection, record: ProjectionRecord, at_time: int, index: TableIndex) -> ProjectionRecord:
    """The record with its tables' rows as of its order key (`record.lookup(name)`); a `Join.key`
    that raises stops the run naming the record, as a `key` function does."""
    if not p.tables or record.is_schema or record.is_truncate:
        return record if not p.tables else replace(record, joined=dict.fromkeys(p.tables))
    at = order_key(at_time, record)
    joined: dict[str, JsonValue] = {}
    for name, join in p.tables.items():
        try:
            key = join.key(record)
        except Exception as exc:  # user code: say which record
            raise RecordError(
                p.name,
                record.topic,
                record.partition,
                record.offset,
                f"tables[{name!r}].key: {type(exc).__name__}: {exc}",
            ) from exc
        joined[name] = None if key is None else index.lookup(join.topic, canonical(key), at)
    return replace(record, joined=joined)


def frontier(p: Projection, checkpoints: Mapping[TP, int], maxes: Mapping[TP, int | None]) -> SortKey | None:
    """The order key of the last fold record the checkpoints cover (the greatest over the
    projection's own topic-partitions), or None when none was applied."""
    last = [
        (m, t, part, checkpoints[(t, part)] - 1)
        for (t, part), m in maxes.items()
        if t in p.topics and m is not None and checkpoints.get((t, part), 0) > 0
    ]
    return max(last) if last else None


def late_table_record(first_new: Sequence[SortKey], applied: SortKey | None) -> bool:
    """Whether a new table record orders before a fold record already applied (`applied`, from
    `frontier`): then what an applied record looked up may differ, and the run recomputes."""
    return applied is not None and any(k < applied for k in first_new)
