"""What a projection is: a frozen declaration a user writes in one Python file.

A projection module exports `PROJECTION` (or `PROJECTIONS`, a list): name, version, source
topics, the key, the output table, and either a DataFrame transform (`build`) or a per-key fold
(`initial`, `apply`, `result`). Spark is only the runner: everything here is plain Python the
unit tests call directly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from tributary.projections.errors import DefinitionError
from tributary.projections.records import ProjectionRecord

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "Column",
    "Emit",
    "Fold",
    "Join",
    "Projection",
    "Table",
    "WindowSpec",
]

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
_TOPIC = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,200}$")
_TYPE = re.compile(r"^[A-Za-z][A-Za-z0-9_ ]*(\(\d+(,\s*\d+)?\))?(\[\])?$")
LatePolicy = Literal["drop", "update"]
WindowKind = Literal["tumbling", "hopping", "session"]


@dataclass(frozen=True, slots=True)
class Column:
    """An output column: `type` is a Postgres type name such as `numeric(20,2)` or `timestamptz`."""

    name: str
    type: str

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise DefinitionError(f"column name {self.name!r} must match {_NAME.pattern}")
        if not _TYPE.match(self.type):
            raise DefinitionError(f"column {self.name!r}: {self.type!r} does not look like a SQL type")


@dataclass(frozen=True, slots=True)
class Table:
    """The output table: ordered columns and the primary key (a subset of them)."""

    columns: tuple[Column, ...]
    primary_key: tuple[str, ...]

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise DefinitionError(f"duplicate column names in {names}")
        if not self.primary_key:
            raise DefinitionError("an output table needs a primary key")
        missing = [k for k in self.primary_key if k not in names]
        if missing:
            raise DefinitionError(f"primary key columns {missing} are not among the columns {names}")

    @classmethod
    def of(cls, columns: Mapping[str, str], primary_key: tuple[str, ...] | list[str]) -> Table:
        """`Table.of({"id": "text", "n": "bigint"}, ["id"])`."""
        return cls(tuple(Column(n, t) for n, t in columns.items()), tuple(primary_key))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """An event-time window. Sizes are milliseconds.

    `lateness`: how far behind its partition's maximum event time a record may be and still
    count (the watermark is max event time seen − lateness). `late`: what happens to a record
    whose window the watermark has closed — `drop` it, or `update` the window if it is within
    `grace` of the window's end.
    """

    kind: WindowKind
    size: int = 0
    hop: int = 0
    gap: int = 0
    lateness: int = 0
    late: LatePolicy = "drop"
    grace: int = 0

    def __post_init__(self) -> None:
        if self.kind in ("tumbling", "hopping") and self.size <= 0:
            raise DefinitionError(f"a {self.kind} window needs size > 0 (ms)")
        if self.kind == "hopping" and not 0 < self.hop <= self.size:
            raise DefinitionError("a hopping window needs 0 < hop <= size")
        if self.kind == "session" and self.gap <= 0:
            raise DefinitionError("a session window needs gap > 0 (ms)")
        if self.kind not in ("tumbling", "hopping", "session"):
            raise DefinitionError(f"window kind must be tumbling|hopping|session, not {self.kind!r}")
        if self.late not in ("drop", "update"):
            raise DefinitionError(f"late policy must be drop|update, not {self.late!r}")
        if self.lateness < 0 or self.grace < 0:
            raise DefinitionError("lateness and grace must be >= 0")

    @classmethod
    def tumbling(cls, size: int, *, lateness: int = 0, late: LatePolicy = "drop", grace: int = 0) -> WindowSpec:
        return cls("tumbling", size=size, lateness=lateness, late=late, grace=grace)

    @classmethod
    def hopping(
        cls, size: int, hop: int, *, lateness: int = 0, late: LatePolicy = "drop", grace: int = 0
    ) -> WindowSpec:
        return cls("hopping", size=size, hop=hop, lateness=lateness, late=late, grace=grace)

    @classmethod
    def session(cls, gap: int, *, lateness: int = 0, late: LatePolicy = "drop", grace: int = 0) -> WindowSpec:
        return cls("session", gap=gap, lateness=lateness, late=late, grace=grace)


@dataclass(frozen=True, slots=True)
class Fold:
    """A per-key fold. `initial(key)` → state; `apply(state, record)` → state;
    `result(state)` → the output row (a dict by column name) or None for "no row".

    With a window, `initial` receives `(key, window_start, window_end)` and `result`
    `(state, window_start, window_end)`; the state must be JSON-able (Decimals allowed).
    """

    initial: Callable[..., Any]
    apply: Callable[[Any, ProjectionRecord], Any]
    result: Callable[..., Mapping[str, Any] | None]


@dataclass(frozen=True, slots=True)
class Join:
    """A topic a fold reads as a *table* (Kafka Streams' KTable of a KStream–KTable join):
    `key(record)` gives, for a record of the projection's own topics, the table's log key to look
    up (e.g. `{"id": record.value["after"]["customer_id"]}`), None for no lookup. The record then
    carries the table's row for that key as of its place in the merge order (`record.lookup`)."""

    topic: str
    key: Callable[[ProjectionRecord], Any]

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not self.topic:
            raise DefinitionError(f"a Join needs a topic name, not {self.topic!r}")
        if not callable(self.key):
            raise DefinitionError(f"Join({self.topic!r}): key must be a function of the record")


@dataclass(frozen=True, slots=True)
class Emit:
    """A derived stream (Kafka Streams' `to(topic)`): after each record a fold applies,
    `records(state, record)` returns the `(key, value)` pairs to append to `topic` of the log
    (JSON values; a None value is a tombstone). Each build writes its own topic (`topic_for`),
    exactly once with the projection's checkpoints."""

    topic: str
    records: Callable[[Any, ProjectionRecord], Iterable[tuple[Any, Any]]]
    partitions: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.topic, str) or not _TOPIC.match(self.topic):
            raise DefinitionError(f"Emit topic {self.topic!r} must match {_TOPIC.pattern}")
        if not callable(self.records):
            raise DefinitionError(f"Emit({self.topic!r}): records must be a function of (state, record)")
        if not isinstance(self.partitions, int) or self.partitions < 1:
            raise DefinitionError(f"Emit({self.topic!r}): partitions must be an int >= 1")

    def topic_for(self, version: int, build: int) -> str:
        """The topic a build writes: `topic` for a projection's first build, then
        `<topic>.v<version>_<build>` (named as the build's table is): a rebuild never appends to
        the stream readers are reading."""
        return self.topic if build == 1 else f"{self.topic}.v{version}_{build}"


@dataclass(frozen=True, slots=True)
class Projection:
    """One projection. Exactly one of `fold` and `build` is set.

    `key(record)` picks the fold key (default: the log key, a JSON value); returning None drops
    the record (truncates excepted: they are delivered by topic-partition). `event_time(record)`
    the event time in ms (default: the event's `occurred_at`, a CDC envelope's `source.ts_ms`,
    else the log timestamp). `schema_records=True` also delivers the CDC topics' schema records
    (`record.is_schema`), which a projection does not see otherwise. `tables` (folds): other topics
    read as tables, each record looking them up as of its place in the merge order
    (`record.lookup(name)`, projections/joins.py). `emit` (plain folds): a derived stream written
    to the log beside the table (`Emit`). `merge` (DataFrame projections): how each non-key
    column of a partial aggregate merges into the stored row — `sum`, `count`, `min`, `max` or an
    SQL expression over `old.<column>` and `new.<column>` — which makes runs read only the new
    records (`projections/incremental.py`). Bumping `version` asks for a rebuild.
    """

    name: str
    version: int
    topics: tuple[str, ...]
    table: Table
    fold: Fold | None = None
    build: Callable[[DataFrame], DataFrame] | None = None
    window: WindowSpec | None = None
    key: Callable[[ProjectionRecord], Any] | None = None
    event_time: Callable[[ProjectionRecord], int] | None = None
    description: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    schema_records: bool = False
    tables: Mapping[str, Join] = field(default_factory=dict)
    emit: Emit | None = None
    merge: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name) or "__" in self.name:
            raise DefinitionError(f"projection name {self.name!r} must match {_NAME.pattern} without '__'")
        if not isinstance(self.version, int) or self.version < 1:
            raise DefinitionError(f"projection {self.name!r}: version must be an int >= 1")
        if not self.topics:
            raise DefinitionError(f"projection {self.name!r}: no source topics")
        if (self.fold is None) == (self.build is None):
            raise DefinitionError(f"projection {self.name!r}: give exactly one of fold= and build=")
        if self.build is not None and self.window is not None:
            raise DefinitionError(
                f"projection {self.name!r}: windows apply to folds; a DataFrame transform windows itself"
            )
        object.__setattr__(self, "topics", tuple(self.topics))
        self._check_tables()
        self._check_emit()
        self._check_merge()

    def _check_merge(self) -> None:
        """`merge`: a DataFrame projection's per-column merge of partial aggregates, one for each
        column outside the primary key (`projections/incremental.py` turns it into SQL)."""
        if not self.merge:
            return
        if self.build is None:
            raise DefinitionError(f"projection {self.name!r}: merge applies to DataFrame projections (build=)")
        if not isinstance(self.merge, Mapping):
            raise DefinitionError(f"projection {self.name!r}: merge must be a dict of column -> merge")
        values = [c for c in self.table.names if c not in self.table.primary_key]
        if sorted(self.merge) != sorted(values):
            raise DefinitionError(
                f"projection {self.name!r}: merge must name every column outside the primary key, "
                f"exactly: {values}, not {sorted(self.merge)}"
            )
        for column, how in self.merge.items():
            if not isinstance(how, str) or not how.strip() or ";" in how:
                raise DefinitionError(
                    f"projection {self.name!r}: merge[{column!r}] must be sum|count|min|max or an SQL "
                    "expression over old.<column> and new.<column>"
                )

    def _check_emit(self) -> None:
        """`emit`: plain folds only (their records are applied once each, in an order a rebuild repeats)."""
        if self.emit is None:
            return
        if not isinstance(self.emit, Emit):
            raise DefinitionError(f"projection {self.name!r}: emit must be an Emit, not {self.emit!r}")
        if self.fold is None or self.window is not None:
            raise DefinitionError(f"projection {self.name!r}: emit applies to folds without a window")
        if self.emit.topic in self.reads:
            raise DefinitionError(f"projection {self.name!r}: emit topic {self.emit.topic!r} is one it reads")

    def _check_tables(self) -> None:
        """`tables`: a mapping of names to `Join`s over topics that are not the fold's own."""
        if not isinstance(self.tables, Mapping):
            raise DefinitionError(f"projection {self.name!r}: tables must be a dict of name -> Join")
        if self.tables and self.build is not None:
            raise DefinitionError(
                f"projection {self.name!r}: tables apply to folds; a DataFrame transform joins the topics it lists"
            )
        for name, join in self.tables.items():
            if not isinstance(name, str) or not _NAME.match(name):
                raise DefinitionError(f"projection {self.name!r}: table name {name!r} must match {_NAME.pattern}")
            if not isinstance(join, Join):
                raise DefinitionError(f"projection {self.name!r}: tables[{name!r}] must be a Join, not {join!r}")
            if join.topic in self.topics:
                raise DefinitionError(
                    f"projection {self.name!r}: tables[{name!r}] reads {join.topic!r}, one of its own topics"
                )

    @property
    def reads(self) -> tuple[str, ...]:
        """Every topic the projection reads: its own, then its tables' (each once)."""
        return self.topics + tuple(dict.fromkeys(j.topic for j in self.tables.values() if j.topic not in self.topics))

    def is_table(self, topic: str) -> bool:
        """Whether `topic` is read only as a table (its records are looked up, never folded)."""
        return topic not in self.topics and any(j.topic == topic for j in self.tables.values())
