"""Running projections: incremental catch-up, rebuild with a zero-downtime view swap, status.

The functions the CLI and API call (`tributary project list|status|run|rebuild`):
`list_projections`, `status`, `run`, `rebuild`, `run_continuous`. One catch-up pass
(`_catch_up`) is the protocol of `projections.local`, distributed:

 1. snapshot the log's committed ends; new records = checkpoint → end per topic-partition;
 2. route new records to units; deliver the new truncates (plain folds over CDC topics) to the
    units with records on their topic-partitions, stored or new; the earliest new record per unit
    decides (against the stored state) whether the unit resumes or is recomputed from all its
    records: its first new record on each topic-partition (its earliest, for session windows);
 3. fold in Spark (shuffle by unit, sort by topic/partition/offset, mapInArrow; the fold merges
    a unit's topic-partitions by event time);
 4. commit rows, deletes, unit states and checkpoints (with truncate points) in one driver-side
    transaction.
A crash anywhere before step 4's commit leaves the previous commit intact: a rerun redoes it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import psycopg

from tributary.log import VIEW_TIMEOUT_S, LogError, MissingMetadataError
from tributary.projections.arrow_copy import distinct_keys, output_lines
from tributary.projections.cluster import fold_partitions, ship_files, task_error
from tributary.projections.definition import Projection
from tributary.projections.emit import Emitter, opened, since
from tributary.projections.engine import (
    Late,
    Prior,
    applies_truncates,
    decide,
    late_records,
    merges_partitions,
    truncate_points,
)
from tributary.projections.errors import LockedError, ProjectionError, RunError
from tributary.projections.executors import check_executors
from tributary.projections.incremental import DRIVER_READ_RECORDS, mode, recompute_reason
from tributary.projections.job import (
    TRUNCATE_COLUMNS,
    TRUNCATE_SCHEMA,
    deliveries,
    fold_frame,
    is_truncate,
    item_of,
    items_frame,
    record_of,
)
from tributary.projections.joins import TableIndex, frontier, late_table_record, order_key, order_times, table_index
from tributary.projections.loader import file_stamps, load_current, resolve
from tributary.projections.small import StateCache, fold_small, folds_small
from tributary.projections.source import LocalSource, LogSource, driver_frame, read_range
from tributary.projections.spark import aggregation_session, get_session, local_cores
from tributary.projections.state import projection_state, state_label
from tributary.projections.store import BuildRow, Store

if TYPE_CHECKING:
    from pyspark import Broadcast
    from pyspark.sql import DataFrame, SparkSession

    from tributary.api.settings.config import Settings
    from tributary.log import KafkaOptions
    from tributary.projections.records import ProjectionRecord, SortKey

__all__ = [
    "RunResult",
    "RunSettings",
    "list_projections",
    "rebuild",
    "rebuild_main",
    "rebuild_process",
    "run",
    "run_continuous",
    "status",
]

Progress = Callable[[str, int, int], None]
TP = tuple[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings:
    """What a run needs, frozen at the edge (the CLI builds it from `tributary.toml`)."""

    dsn: str
    log_root: Path
    modules: tuple[str, ...] = ()
    mirror: tuple[str, ...] = ()
    schema: str = "views"
    spark_master: str = "local[*]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    shuffle_partitions: int | None = None  # None: spark_conf's spark.sql.shuffle.partitions, else the slots
    executor_dsn: str | None = None  # where executors COPY a fold's output (None: `dsn`)
    executor_timeout_s: float = 120.0  # how long a cluster run waits for an executor to run a task
    split_bytes: int = 16 << 20
    max_passes: int = 5
    skip_errors: bool = False
    kafka: KafkaOptions | None = None  # `[log] backend = "kafka"`: read `[log.kafka]`, not `log_root`
    kafka_split_offsets: int = 100_000  # on Kafka: offsets per executor task, at most
    kafka_reader: Literal["python", "spark"] = "python"  # on Kafka: kafka_source, or spark_kafka_source
    small_pass_records: int = 0  # a plain fold's pass of at most this many records folds in the driver
    state_cache_units: int = 100_000  # `run_continuous`: units' states kept between its small passes
    driver_read_records: int = DRIVER_READ_RECORDS  # a merging DataFrame pass of at most this many: driver reads

    @classmethod
    def from_settings(cls, settings: Settings, *, dsn: str | None = None) -> RunSettings:
        """From `api.config.Settings` (pass `dsn` when the service DSN is the embedded default)."""
        service = dsn or settings.service.dsn
        if not service:
            raise RunError("no service database to keep the projections in: set [service] dsn")
        pr = settings.projections
        kafka = None
        if settings.log.backend == "kafka":
            from tributary.api.settings.log import kafka_options

            kafka = kafka_options(settings)
        return cls(
            dsn=service,
            log_root=Path(settings.log.root),
            modules=tuple(pr.modules),
            mirror=tuple(pr.mirror),
            schema=pr.schema_,
            spark_master=pr.spark_master,
            spark_conf=dict(pr.spark_conf),
            kafka=kafka,
            kafka_reader=pr.kafka_reader,
            shuffle_partitions=pr.shuffle_partitions,
            executor_dsn=pr.executor_dsn,
            executor_timeout_s=pr.executor_timeout_s,
            state_cache_units=pr.state_cache_units,
            driver_read_records=pr.driver_read_records,
        )


@dataclass(frozen=True, slots=True)
class RunResult:
    name: str
    build: int
    table: str
    records: int  # offsets covered: on Kafka transaction markers and aborted records count too
    rows: int
    rebuilt: bool
    seconds: float
    recomputed: int = 0


@dataclass(frozen=True, slots=True)
class ProjectionStatus:
    name: str
    version: int
    build: int | None
    build_version: int | None
    state: str
    table: str | None
    records: int
    lag: int
    late_dropped: int
    needs_rebuild: bool
    other_builds: tuple[str, ...] = field(default=())
    dead_letters: int = 0
    last_error: str | None = None
    label: str = ""  # the state as people read it: `behind (162 records)` (`projections.state`)
    stream: str | None = None  # a projection that emits: the topic its serving build writes (`Emit.topic_for`)
    mode: str = ""  # `incremental`, or `recomputes: <why>` (a DataFrame projection: `projections.incremental`)


def _connect(s: RunSettings) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(s.dsn, autocommit=True)
    except psycopg.OperationalError as exc:
        raise RunError(f"cannot connect to the service database ([service] dsn): {exc}") from exc


STATUS_TIMEOUT_S = VIEW_TIMEOUT_S  # `project status`, `/projections`, `/metrics`: not a run's 30 s


def _open_log(s: RunSettings, *, timeout_s: float | None = None) -> LogSource:
    """The log a run reads, by `[log] backend`: the local log under `log_root`, or Kafka."""
    if s.kafka is not None:
        from tributary.projections.kafka_source import TIMEOUT_S, KafkaSource
        from tributary.projections.spark_kafka_source import SparkKafkaSource

        kind = SparkKafkaSource if s.kafka_reader == "spark" else KafkaSource
        return kind(s.kafka, split_offsets=s.kafka_split_offsets, timeout_s=timeout_s or TIMEOUT_S)
    return LocalSource(s.log_root)


def _spark_error(exc: Exception) -> ProjectionError:
    m = re.search(r"projection '[^']*' failed on [^\n]*", str(exc))
    if m:
        return RunError(m.group(0))
    cause = task_error(str(exc))  # the task's own Python error, not Spark's "Job aborted" line
    if cause is None:
        cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return RunError(f"the Spark job failed: {cause}")


@dataclass(frozen=True, slots=True)
class _Pass:
    records: int = 0
    rows: int = 0
    recomputed: int = 0


@dataclass(frozen=True, slots=True)
class _Span:
    """What one pass reads, per topic-partition of the projection's topics: from its checkpoint
    (`lo`) to the log's committed end (`ends`), with the max event time its checkpoint stored
    (`base`, where windowed watermarks continue from)."""

    ends: Mapping[TP, int]
    lo: Mapping[TP, int]
    base: Mapping[TP, int | None]
    topics: tuple[str, ...]  # the projection's topics that have partitions in the log
    resumed: bool  # the build has checkpoints: its state table may know the units read

    @property
    def total(self) -> int:
        """Offsets the pass covers."""
        return sum(self.ends[tp] - self.lo[tp] for tp in self.ends if self.ends[tp] > self.lo[tp])

    def checkpoints(self) -> dict[TP, tuple[int, int | None]]:
        """Each topic-partition's checkpoint after the pass: at its end, max event time as before."""
        return {tp: (end, self.base[tp]) for tp, end in self.ends.items()}


def _span(store: Store, log: LogSource, p: Projection, b: BuildRow) -> _Span:
    """Step 1: snapshot the log's committed ends against the build's checkpoints."""
    ends = log.ends(p.reads)
    ck = store.checkpoints(b)
    return _Span(
        ends=ends,
        lo={tp: ck.get(tp, (0, None))[0] for tp in ends},
        base={tp: ck.get(tp, (0, None))[1] for tp in ends},
        topics=tuple(t for t in p.reads if any(tp[0] == t for tp in ends)),
        resumed=bool(ck),
    )


def _catch_up(
    s: RunSettings,
    spark: SparkSession,
    store: Store,
    log: LogSource,
    p: Projection,
    b: BuildRow,
    progress: Progress | None = None,
    stage: str = "catching_up",
    cache: StateCache | None = None,
) -> _Pass:
    """One pass from the checkpoints to the log's committed end: a DataFrame transform's over
    the whole log (an incremental one's over the new records), or a fold's over the new records
    (steps 1–4 of this module's docstring)."""
    span = _span(store, log, p, b)
    total = span.total
    if total == 0:
        return _Pass()
    if progress:
        progress(stage, 0, total)
    with _reported_as_run_errors():
        if p.build is not None:
            done = _transform_pass(s, spark, store, log, p, b, span)
        elif (small := _small_pass(s, store, log, p, b, span, cache)) is not None:
            done = small
        else:
            with opened(s.log_root, s.kafka, p, b) as emitter:
                done = _fold_pass(s, spark, store, log, p, b, span, emitter)
    if progress:
        progress(stage, total, total)
    return done


@contextmanager
def _reported_as_run_errors() -> Iterator[None]:
    """Spark wraps a task's error in its own: report the record (`projection … failed on …`),
    not the stack. Our own errors, and any other, pass as they are."""
    try:
        yield
    except ProjectionError:
        raise
    except Exception as exc:
        if type(exc).__module__.startswith(("pyspark", "py4j")):
            raise _spark_error(exc) from exc
        raise


def _read(
    s: RunSettings,
    log: LogSource,
    p: Projection,
    span: _Span,
    spark: SparkSession,
    start: Mapping[TP, int],
    max_bytes: int | None = None,
) -> DataFrame:
    """The projection's records from `start` (empty: the log's beginning) to the span's ends, in
    row splits of `max_bytes` (default `split_bytes`)."""
    return log.records_frame(
        spark,
        modules=s.modules,
        mirror=s.mirror,
        name=p.name,
        topics=span.topics,
        lo=start,
        hi=span.ends,
        max_bytes=max_bytes or s.split_bytes,
    )


def _small_pass(
    s: RunSettings, store: Store, log: LogSource, p: Projection, b: BuildRow, span: _Span, cache: StateCache | None
) -> _Pass | None:
    """A pass of few records folded in the driver (`projections.small`): milliseconds, where a
    Spark job costs seconds. None when it cannot be (the pass then runs on Spark)."""
    if span.total > s.small_pass_records or not isinstance(log, LocalSource) or not folds_small(p):
        return None
    rows = fold_small(
        store,
        log,
        p,
        b,
        lo=span.lo,
        checkpoints=span.checkpoints(),
        records=span.total,
        resumed=span.resumed,
        skip_errors=s.skip_errors,
        cache=cache,
    )
    return None if rows is None else _Pass(span.total, rows)


INCREMENTAL_SPLIT_BYTES = 1 << 20
"""Row splits of an incremental DataFrame run: the split holding a checkpoint is read from its
start, so with `split_bytes` (16 MB) a run of a few new records would read up to 16 MB per
partition before them."""


def _transform_pass(
    s: RunSettings, spark: SparkSession, store: Store, log: LogSource, p: Projection, b: BuildRow, span: _Span
) -> _Pass:
    """A DataFrame transform recomputes over the whole log, its output replacing the table; an
    incremental one (`incremental.recompute_reason` None) whose build has checkpoints aggregates
    only the new records (read in the driver when few: `driver_read_records`) and merges the
    partials into the table."""
    assert p.build is not None
    merging = span.resumed and recompute_reason(p) is None
    few = merging and span.total <= s.driver_read_records
    local = log if few and isinstance(log, LocalSource) else None  # read in the driver
    session = aggregation_session(spark, 1 if local is not None else _partitions(s, spark))
    if local is not None:  # few new records: one in-memory partition, shuffles of one (one task per stage)
        records = driver_frame(session, p, read_range(local, span.lo, span.ends))
    elif merging:  # a split is read from its first byte: small ones waste little before the checkpoint
        records = _read(s, log, p, span, session, span.lo, min(s.split_bytes, INCREMENTAL_SPLIT_BYTES))
    else:
        records = _read(s, log, p, span, session, {})
    out = p.build(records).toArrow()
    lines = output_lines(p, out)  # checks the rows (unknown columns, NULL keys) first
    if merging:
        return _Pass(span.total, store.merge_rows(p, b, [lines], span.checkpoints(), span.total))
    rows = store.replace_rows(p, b, [lines], span.checkpoints(), span.total, distinct_keys=distinct_keys(p, out))
    return _Pass(span.total, rows)


def _fold_pass(
    s: RunSettings,
    spark: SparkSession,
    store: Store,
    log: LogSource,
    p: Projection,
    b: BuildRow,
    span: _Span,
    emitter: Emitter | None = None,
) -> _Pass:
    """A fold's pass (steps 2–4): the new records routed to units (with the new truncates
    delivered), each touched unit resumed from its stored state or recomputed from all its
    records, folded by Spark tasks into staging tables, committed with the checkpoints. With an
    `emitter`, the records emitted from where the log says the stream is are committed to the log
    first (projections/emit.py)."""
    ref = (s.modules, s.mirror, p.name)
    store.upgrade_state(b)
    new_records = _read(s, log, p, span, spark, span.lo)
    tables, late_table = _tables(s, spark, store, log, p, b, span)
    items = items_frame(spark, new_records, ref, p.window is not None, span.base, tables)
    truncating = applies_truncates(p)
    points = store.truncate_points(b) if truncating else {}
    priors: dict[str, Prior] = {}
    recompute: set[str] = set()
    fresh = None
    if span.resumed or truncating or p.window is not None:  # read the new records once for every job below
        fresh = items = items.persist()
    try:
        late = _late(p, items)
        if truncating:
            items, points = _deliver(spark, store, b, items, points)
        if span.resumed:  # the state table may know these units: resume or recompute each
            merged = merges_partitions(p)
            firsts = _first_new_records(items, merged=merged)
            force: set[str] = set()
            if late_table:  # a table record ordered before records already applied: recompute every unit
                force = set(store.units(b))
                firsts = {**dict.fromkeys(force, []), **firsts}
            priors, recompute = decide(store.priors(b, list(firsts)), firsts, force, merged=merged)
        if recompute:
            everything = items_frame(spark, _read(s, log, p, span, spark, {}), ref, p.window is not None, {}, tables)
            items = _recomputed(spark, items, everything, recompute, truncating=truncating)
        ordered = p.window is not None or bool(p.tables)  # their checkpoints keep each partition's max event time
        checkpoints = _watermarked(span, new_records) if ordered else span.checkpoints()
        staged = store.staging(p, b)
        emit_from = None if emitter is None else since(span.lo, emitter.emitted())
        summaries = (
            fold_frame(
                spark,
                items,
                ref,
                priors,
                _partitions(s, spark),
                dsn=s.executor_dsn or s.dsn,
                staging=staged.tables,
                skip_errors=s.skip_errors,
                since=emit_from,
            )
            .toArrow()
            .to_pylist()
        )
    finally:
        if fresh is not None:
            fresh.unpersist()
    if (
        emitter is not None
    ):  # the stream and its position first: a crash before the table's commit redoes the table only
        emitter.write(store.staged_emits(staged), {tp: end for tp, (end, _) in checkpoints.items()})
    rows = store.commit_folds(p, b, staged, summaries, checkpoints, span.total, truncates=points, late=late)
    return _Pass(span.total, rows, len(recompute))


def _tables(
    s: RunSettings, spark: SparkSession, store: Store, log: LogSource, p: Projection, b: BuildRow, span: _Span
) -> tuple[Broadcast[TableIndex] | None, bool]:
    """A fold with tables: their records, read whole to the driver, indexed by key in merge order
    and broadcast to the tasks (as a Kafka Streams GlobalKTable is copied to every instance); and
    whether a new table record orders before a record already applied (`joins.late_table_record`)."""
    if not p.tables:
        return None, False
    topics = tuple(t for t in span.topics if p.is_table(t))
    hi = {tp: end for tp, end in span.ends.items() if tp[0] in topics}
    rows = []
    if topics:
        frame = log.records_frame(
            spark, modules=s.modules, mirror=s.mirror, name=p.name, topics=topics, lo={}, hi=hi, max_bytes=s.split_bytes
        )
        rows = frame.select(*TRUNCATE_COLUMNS).collect()
    by_tp: dict[TP, list[ProjectionRecord]] = {}
    for row in rows:
        r = record_of(row.asDict())
        by_tp.setdefault((r.topic, r.partition), []).append(r)
    keyed: list[tuple[SortKey, ProjectionRecord]] = []
    first_new: list[SortKey] = []
    for tp, recs in by_tp.items():
        recs.sort(key=lambda r: r.offset)
        fresh = [order_key(t, r) for r, t in zip(recs, order_times(r.event_time for r in recs), strict=True)]
        keyed += zip(fresh, recs, strict=True)
        first_new += [k for k, r in zip(fresh, recs, strict=True) if r.offset >= span.lo.get(tp, 0)][:1]
    ck = store.checkpoints(b)
    applied = frontier(p, {tp: o for tp, (o, _) in ck.items()}, {tp: m for tp, (_, m) in ck.items()})
    return spark.sparkContext.broadcast(table_index(keyed)), late_table_record(first_new, applied)


def _late(p: Projection, items: DataFrame) -> list[Late]:
    """The new records past their window's lateness (few: they come to the driver), as
    `engine.late_records` gives them; a recomputed unit's earlier ones are kept already."""
    if p.window is None:
        return []
    from pyspark.sql import functions as F

    rows = items.where(~F.col("admitted") & F.col("watermark").isNotNull()).collect()
    return late_records(p, [item_of(r.asDict()) for r in rows])


def _first_new_records(items: DataFrame, *, merged: bool) -> dict[str, list[SortKey]]:
    """What decides whether a unit resumes (`engine.decide`): its first new record on each
    topic-partition when the fold merges them by event time, else (session windows) its
    earliest new record."""
    from pyspark.sql import functions as F

    firsts: dict[str, list[SortKey]] = {}
    if merged:
        by_tp = items.groupBy("unit", "topic", "partition").agg(F.min(F.struct("offset", "event_time")).alias("m"))
        for r in by_tp.collect():
            firsts.setdefault(r["unit"], []).append(
                (r["m"]["event_time"], r["topic"], r["partition"], r["m"]["offset"])
            )
        return firsts
    by_unit = items.groupBy("unit").agg(F.min(F.struct("event_time", "topic", "partition", "offset")).alias("m"))
    for r in by_unit.collect():
        event_time, topic, partition, offset = r["m"]
        firsts[r["unit"]] = [(event_time, topic, partition, offset)]
    return firsts


def _recomputed(
    spark: SparkSession, items: DataFrame, everything: DataFrame, recompute: Collection[str], *, truncating: bool
) -> DataFrame:
    """`items` with the units to recompute given all their records of the log (`everything`),
    and, for a fold that applies truncates, every truncate of the log delivered to them."""
    from pyspark.sql import functions as F

    rc = F.broadcast(spark.createDataFrame([(u,) for u in sorted(recompute)], "unit string"))
    if truncating:
        trunc = is_truncate()
        theirs = everything.where(~trunc).join(rc, "unit", "left_semi")
        holders = theirs.select("unit", "topic", "partition").distinct()
        every = everything.where(trunc).select(*TRUNCATE_COLUMNS)
        theirs = theirs.unionByName(deliveries(every, holders))
    else:
        theirs = everything.join(rc, "unit", "left_semi")
    return items.join(rc, "unit", "left_anti").unionByName(theirs)


def _watermarked(span: _Span, new_records: DataFrame) -> dict[TP, tuple[int, int | None]]:
    """A windowed fold's checkpoints: watermarks continue from each partition's max event time."""
    from pyspark.sql import functions as F

    out = span.checkpoints()
    for r in new_records.groupBy("topic", "partition").agg(F.max("event_time").alias("m")).collect():
        tp = (r["topic"], r["partition"])
        prev = span.base.get(tp)
        out[tp] = (span.ends[tp], r["m"] if prev is None else max(prev, r["m"]))
    return out


def _deliver(
    spark: SparkSession, store: Store, b: BuildRow, items: DataFrame, points: Mapping[TP, tuple[int, int]]
) -> tuple[DataFrame, dict[TP, tuple[int, int]]]:
    """`engine.deliver_truncates` on Spark: the new truncates (few) come to the driver; each is
    joined to the holders of its topic-partition — units of the new records, and stored units
    whose `tps` name it. Returns (items with deliveries, new truncate points)."""
    from pyspark.sql import functions as F

    trunc = is_truncate()
    found = items.where(trunc).select(*TRUNCATE_COLUMNS).collect()
    items = items.where(~trunc)
    if not found:
        return items, dict(points)
    new_points = truncate_points(points, found)
    tps = sorted({(r["topic"], r["partition"]) for r in found})
    on_tps = F.broadcast(spark.createDataFrame(tps, "topic string, partition int"))
    holders = items.join(on_tps, ["topic", "partition"], "left_semi").select("unit", "topic", "partition")
    stored = store.holders(b, tps)
    if stored:
        holders = holders.unionByName(spark.createDataFrame(stored, "unit string, topic string, partition int"))
    truncates = spark.createDataFrame([tuple(r) for r in found], TRUNCATE_SCHEMA)
    return items.unionByName(deliveries(truncates, holders.distinct())), new_points


_SEEN_ROOTS: set[tuple[str, str, tuple[str, ...]]] = set()  # (application, log root, modules) checked


def _session(s: RunSettings, spark: SparkSession | None) -> SparkSession:
    """The session of a run; on a cluster with the local log, first (once per application and log
    root) a check that every executor sees the log root (on Kafka the executors reach the brokers)."""
    if spark is None and s.kafka is not None and s.kafka_reader == "spark":
        from tributary.projections.spark_kafka_source import CONNECTOR_LIB, missing_connector, spark_jar_dirs

        missing = missing_connector(s.spark_conf, CONNECTOR_LIB, spark_jar_dirs())
        if missing is not None:
            raise RunError(missing)
    sess = (
        spark
        if spark is not None
        else get_session(s.spark_master, shuffle_partitions=s.shuffle_partitions, conf=s.spark_conf)
    )
    sc = sess.sparkContext
    if local_cores(sc.master) is None:  # local masters run their tasks on this host, in this Python
        seen = (str(sc.applicationId), str(s.log_root), s.modules)
        if seen not in _SEEN_ROOTS:
            ship_files(sc, s.modules)
            root = s.log_root if s.kafka is None else None  # on Kafka the executors reach the brokers
            check_executors(sess, root=root, modules=s.modules, mirror=s.mirror, timeout_s=s.executor_timeout_s)
            _SEEN_ROOTS.add(seen)
        if spark is None and "spark.sql.shuffle.partitions" not in s.spark_conf:
            sess.conf.set("spark.sql.shuffle.partitions", str(_partitions(s, sess)))  # the registered slots
    return sess


def _partitions(s: RunSettings, spark: SparkSession) -> int:
    """A pass's shuffle partitions: the setting, the configuration's, or the cluster's slots now."""
    return fold_partitions(s.shuffle_partitions, s.spark_conf, spark.sparkContext.defaultParallelism)


class _Locked:
    """Connection + store + per-projection advisory lock for the length of one operation."""

    def __init__(self, s: RunSettings, name: str) -> None:
        self.name = name
        self.conn = _connect(s)
        self.store = Store(self.conn, schema=s.schema)
        self.store.ensure()
        if not self.store.try_lock(name):
            self.conn.close()
            raise LockedError(f"projection {name!r} is being run or rebuilt by another process")

    def __enter__(self) -> Store:
        return self.store

    def __exit__(self, *exc: object) -> None:
        try:
            self.store.unlock(self.name)
        finally:
            self.conn.close()


def _rebuild(s: RunSettings, spark: SparkSession, store: Store, p: Projection, progress: Progress | None) -> RunResult:
    t0 = time.monotonic()
    stamps = file_stamps(s.modules)
    log = _open_log(s)
    b = store.new_build(p)
    records = rows = 0
    try:
        for i in range(s.max_passes):  # catch up until a pass finds nothing new
            log.refresh()
            done = _catch_up(s, spark, store, log, p, b, progress, "building" if i == 0 else "catching_up")
            records, rows = records + done.records, rows + done.rows
            if done.records == 0:
                break
            if i == 0:
                store.set_status(b, "catching_up")
        if file_stamps(s.modules) != stamps:  # Spark workers may have run the edited code
            raise RunError(f"projection files changed while {p.name!r} was being rebuilt; rebuild it again")
        store.set_status(b, "swapping")
        old = store.swap(b)
        for table in old:
            store.drop_build(p.name, table)
    except BaseException as exc:
        store.set_status(b, "failed", str(exc)[:2000])
        raise
    finally:
        log.close()
    return RunResult(p.name, b.build, b.table_name, records, rows, True, time.monotonic() - t0)


def rebuild(
    name: str, settings: RunSettings, *, spark: SparkSession | None = None, progress: Progress | None = None
) -> RunResult:
    """Build `<schema>.<name>__v<version>_<build>` from offset 0 while the old build keeps
    serving, catch up to the log end, swap the view `<schema>.<name>` in one transaction and
    drop the old builds. A failure leaves the old build serving and the new one `failed`."""
    p = resolve(settings.modules, settings.mirror, name)
    with _Locked(settings, name) as store:
        return _rebuild(settings, _session(settings, spark), store, p, progress)


_MARK = "tributary-rebuild "  # the child's protocol lines on stdout; Spark may print other lines there


def rebuild_process(name: str, settings: RunSettings, *, progress: Progress | None = None) -> RunResult:
    """`rebuild` in a new Python process: it imports the projection files as they are now, so a
    long-running caller (`tributary serve`) never builds with, or labels a build after, code it
    loaded earlier. Progress comes back line by line; a failure raises `RunError` with its line."""
    import json
    import subprocess
    import sys
    import tempfile

    args = json.dumps({"name": name, "settings": {**_settings_json(settings)}})
    code = "from tributary.projections.runner import rebuild_main; rebuild_main()"
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(  # the settings on stdin, not argv: DSN and Kafka client secrets stay out of `ps`
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            bufsize=1,
        )
        result: dict[str, Any] | None = None
        failure: str | None = None
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(args + "\n")
        proc.stdin.close()
        with proc.stdout:  # closed once read: an open pipe outlives the child as a ResourceWarning
            for line in proc.stdout:
                if not line.startswith(_MARK):
                    continue
                msg = json.loads(line[len(_MARK) :])
                if "progress" in msg and progress is not None:
                    progress(*msg["progress"])
                result, failure = msg.get("result", result), msg.get("error", failure)
        code_ = proc.wait()
        if result is not None and code_ == 0:
            return RunResult(**result)
        if failure is None:
            err.seek(0)
            lines = [x for x in err.read().splitlines() if x.strip()]
            failure = f"the rebuild process exited with status {code_}" + (f": {lines[-1]}" if lines else "")
        raise RunError(failure)


def _settings_json(s: RunSettings) -> dict[str, Any]:
    import dataclasses

    def plain(v: Any) -> Any:
        if isinstance(v, Path):
            return str(v)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        return dict(v) if isinstance(v, Mapping) else v

    return {f: plain(v) for f in s.__slots__ if (v := getattr(s, f)) is not None}


def _settings_from_json(raw: Mapping[str, Any]) -> RunSettings:
    """`_settings_json`'s inverse."""
    kafka = None
    if raw.get("kafka") is not None:
        from tributary.log import KafkaOptions

        kafka = KafkaOptions(**raw["kafka"])
    return RunSettings(
        **{
            **raw,
            "log_root": Path(raw["log_root"]),
            "modules": tuple(raw["modules"]),
            "mirror": tuple(raw["mirror"]),
            "kafka": kafka,
        }
    )


def rebuild_main() -> None:
    """The child of `rebuild_process`: {"name", "settings"} on stdin (or argv[1]); reports on stdout."""
    import json
    import sys

    args = json.loads(sys.argv[1] if len(sys.argv) > 1 else sys.stdin.readline())
    s = _settings_from_json(args["settings"])

    def say(msg: dict[str, Any]) -> None:
        sys.stdout.write(_MARK + json.dumps(msg) + "\n")
        sys.stdout.flush()

    try:
        result = rebuild(args["name"], s, progress=lambda stage, done, total: say({"progress": [stage, done, total]}))
    except Exception as exc:  # noqa: BLE001 - one line to the parent, which reports it
        say({"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__})
        sys.exit(1)
    say({"result": {f: getattr(result, f) for f in result.__slots__}})


def run(
    name: str, settings: RunSettings, *, spark: SparkSession | None = None, progress: Progress | None = None
) -> RunResult:
    """Catch the current build up to the log end; rebuild first if there is none or the
    projection's version changed."""
    p = resolve(settings.modules, settings.mirror, name)
    with _Locked(settings, name) as store:
        cur = store.current(name)
        sess = _session(settings, spark)
        if cur is None or cur.version != p.version:
            return _rebuild(settings, sess, store, p, progress)
        t0 = time.monotonic()
        log = _open_log(settings)
        try:
            done = _catch_up(settings, sess, store, log, p, cur, progress)
        finally:
            log.close()
        return RunResult(
            name,
            cur.build,
            cur.table_name,
            done.records,
            done.rows,
            False,
            time.monotonic() - t0,
            done.recomputed,
        )


SMALL_PASS_RECORDS = 20_000  # `run_continuous`: passes of at most this many records fold in the driver


def run_continuous(
    name: str,
    settings: RunSettings,
    *,
    freshness_s: float = 5.0,
    stop: Callable[[], bool] = lambda: False,
    sleep: Callable[[float], None] = time.sleep,
    spark: SparkSession | None = None,
) -> int:
    """`project run --continuous`: catch up again at once while records arrive; while idle, wait
    for the log to change (`_Watch`: the local log's manifest replaced, Kafka's ends moved) for
    at most `freshness_s`, running no pass meanwhile. A plain fold's passes of few records fold in
    the driver (`projections.small`); the Spark session is made once, and the connection, the
    lock and the units' states are kept between passes (`_Continuous`). Returns the passes made."""
    s = settings if settings.small_pass_records else replace(settings, small_pass_records=SMALL_PASS_RECORDS)
    watch = _Watch(s, resolve(s.modules, s.mirror, name).reads)
    runs = _Continuous(name, s, spark)
    passes = 0
    try:
        while not stop():
            mark = watch.stamp()  # before the pass: a commit during it wakes the wait at once
            try:
                records = runs.step()
            except LockedError:  # a rebuild holds it: it catches up itself; wait for what comes next
                records = 0
            passes += 1
            if not records:
                runs.idle()
                watch.wait(mark, freshness_s, stop, sleep)
    finally:
        try:
            runs.close()
        finally:
            watch.close()
    return passes


class _Continuous:
    """The passes of one continuous run over one connection: it takes the projection's lock for
    its first pass and keeps it, the log and the units' states (`StateCache`) while records keep
    coming; idle, it lets the lock go (a rebuild or a one-off run may take it meanwhile: the cache
    notices their commits by the checkpoints) and takes it again for the next pass. A failed pass
    empties the cache and closes the connection (the next pass, if any, reconnects); a lost
    connection stops the run with one line, since the lock went with it."""

    def __init__(self, name: str, s: RunSettings, spark: SparkSession | None) -> None:
        self.name = name
        self.s = s
        self.spark = _session(s, spark)
        self.held: _Locked | None = None
        self.locked = False
        self.log: LogSource | None = None
        self.cache = StateCache(s.state_cache_units)

    def step(self) -> int:
        """One pass (a rebuild first if the projection's version changed); the records read."""
        try:
            return self._step()
        except LockedError:
            raise
        except psycopg.OperationalError as exc:
            lost = self.held is not None and self.held.conn.broken
            self._drop()
            if not lost:
                raise
            raise RunError(
                f"projection {self.name!r}: lost the connection to the service database, and its lock "
                f"with it: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
            ) from exc
        except BaseException:
            self._drop()
            raise

    def _step(self) -> int:
        p = resolve(self.s.modules, self.s.mirror, self.name)
        if self.held is None:
            self.held = _Locked(self.s, self.name)
            self.locked = True
        elif not self.locked:
            self._relock()
        store = self.held.store
        cur = store.current(self.name)
        if cur is None or cur.version != p.version:
            self.cache.clear()
            return _rebuild(self.s, self.spark, store, p, None).records
        if self.log is None:
            self.log = _open_log(self.s)
        else:
            self.log.refresh()
        return _catch_up(self.s, self.spark, store, self.log, p, cur, cache=self.cache).records

    def _relock(self) -> None:
        """Take the lock again after an idle wait; a connection lost meanwhile held no lock: reconnect."""
        assert self.held is not None
        try:
            got = self.held.store.try_lock(self.name)
        except psycopg.OperationalError:
            self._drop()
            self.held = _Locked(self.s, self.name)
            got = True
        if not got:
            raise LockedError(f"projection {self.name!r} is being run or rebuilt by another process")
        self.locked = True

    def idle(self) -> None:
        """Nothing new: let the lock go until the next pass (the connection and cache stay)."""
        if self.held is not None and self.locked:
            self.held.store.unlock(self.name)
            self.locked = False

    def _drop(self) -> None:
        """After an error: forget the states and the connection (its lock goes with it)."""
        self.cache.clear()
        held, self.held, self.locked = self.held, None, False
        if held is not None:
            held.conn.close()

    def close(self) -> None:
        if self.held is not None and self.locked:
            self.held.__exit__(None, None, None)
        elif self.held is not None:
            self.held.conn.close()
        self.held = None
        if self.log is not None:
            self.log.close()
            self.log = None


class _Watch:
    """How a continuous run learns that records were committed, without a pass: it compares the
    log's `stamp` every `watch_interval_s` (a stat of the local log's manifest every 10 ms; Kafka's
    ends every 100 ms). A log not there yet is looked for again every 0.25 s."""

    def __init__(self, s: RunSettings, topics: Sequence[str]) -> None:
        self.s = s
        self.topics = topics
        self.log: LogSource | None = None

    def stamp(self) -> object:
        if self.log is None:
            try:
                self.log = _open_log(self.s)
            except LogError:
                return None  # nothing captured yet
        return self.log.stamp(self.topics)

    def wait(self, mark: object, timeout_s: float, stop: Callable[[], bool], sleep: Callable[[float], None]) -> None:
        """Until the stamp differs from `mark`, `stop()`, or `timeout_s` passed."""
        deadline = time.monotonic() + timeout_s
        while not stop():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            sleep(min(left, 0.25 if self.log is None else self.log.watch_interval_s))
            if self.stamp() != mark:
                return

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


def list_projections(settings: RunSettings) -> list[dict[str, Any]]:
    """Name, version, topics, kind and window of every configured projection."""
    return [
        {
            "name": p.name,
            "version": p.version,
            "topics": list(p.topics),
            "kind": "fold" if p.fold is not None else "dataframe",
            "window": None if p.window is None else p.window.kind,
            "description": p.description,
            "mode": mode(p),
        }
        for p in load_current(settings.modules, settings.mirror).values()
    ]


def status(
    settings: RunSettings,
    name: str | None = None,
    *,
    projections: Mapping[str, Projection] | None = None,
    rebuilding: Collection[str] = (),
) -> list[ProjectionStatus]:
    """Per projection: serving build, its state (`projections.state`: `done` only when caught up),
    records read, lag behind the log, late records dropped, and whether the file's version asks for
    a rebuild. `projections`: the definitions to report on (the API's, which outlive a file saved
    half-way), else the files'. `rebuilding`: projections whose rebuild another process has started."""
    if projections is None:
        projections = load_current(settings.modules, settings.mirror)
    names = [name] if name else sorted(projections)
    out: list[ProjectionStatus] = []
    with _connect(settings) as conn:
        store = Store(conn, schema=settings.schema)
        store.ensure()
        try:
            log: LogSource | None = _open_log(settings, timeout_s=STATUS_TIMEOUT_S)
        except MissingMetadataError:
            raise  # segments without a manifest are not "nothing captured yet"
        except LogError:  # nothing captured yet: lag unknown, status still useful
            log = None
        for n in names:
            p = projections[n] if n in projections else resolve(settings.modules, settings.mirror, n)
            builds = store.builds(n)
            cur = next((b for b in builds if b.current), None)
            lag = 0
            if log is not None:  # never run: everything in its topics is waiting
                ck = store.checkpoints(cur) if cur is not None else {}
                lag = sum(max(0, e - ck.get(tp, (0, None))[0]) for tp, e in log.ends(p.reads).items())
            others = tuple(f"{b.table_name}:{b.status}" for b in builds if not b.current)
            newest = builds[-1].status if builds else None
            state = projection_state(cur is not None, newest, lag, locked=store.locked(n), started=n in rebuilding)
            out.append(
                ProjectionStatus(
                    n,
                    p.version,
                    cur.build if cur else None,
                    cur.version if cur else None,
                    state,
                    cur.table_name if cur else None,
                    cur.records if cur else 0,
                    lag,
                    store.dropped_total(cur) if cur else 0,
                    cur is None or cur.version != p.version,
                    others,
                    store.dead_letters(cur) if cur else 0,
                    next((b.error for b in reversed(builds) if b.status == "failed"), None),
                    state_label(state, lag),
                    None if p.emit is None or cur is None else p.emit.topic_for(cur.version, cur.build),
                    mode(p),
                )
            )
        if log is not None:
            log.close()
    return out
