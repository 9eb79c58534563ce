"""Benchmark: projection rebuilds on Spark against baselines measured in the same run.

For each size N (events over --keys accounts in `events.account`, 4 partitions):
  * fold      — `account_balances` rebuilt by the Spark runner (log → fold → COPY/merge → swap);
  * dataframe — `account_totals` (DataFrame groupBy over the VARIANT value `value_v`) rebuilt by
                the Spark runner --repeat times (the first run in this JVM is reported on its own:
                the JIT has not compiled the VARIANT read yet); dataframe_json — the same projection
                reading the JSON text with `from_json` (as a file written before `value_v` existed),
                and whether both tables agree;
  * (a) pg    — the same aggregation as one `INSERT … SELECT … GROUP BY` inside Postgres over a
                table holding the same rows (loaded by COPY beforehand, not timed), --repeat times;
                ratios are of medians, and of the first runs;
  * (b) py    — a single-process Python fold reading the log (same engine, same order);
  * (c) duckdb — the same aggregation by duckdb over the same Parquet copies the log made (the
                files the rebuild reads), its result COPYed into a new Postgres table with the
                same primary key through psycopg, timed end to end, --repeat times (duckdb's
                postgres extension is a download; this is what a user with the wheel alone does);
  * phases    — with --profile, where one DataFrame rebuild's time goes (session, plan and
                frame, Spark read + aggregate + collect, COPY text, COPY + commit, swap, drop);
  * incremental — `run` after --incremental new events on top of N (the fold);
  * dataframe_incremental — `account_totals` (incremental: `merge=`) built over N, then --repeat
                `run`s each after --incremental new events (each aggregates only them and merges
                the partials into the table) with the new records read in the driver, alternating
                with as many read by Spark tasks (`driver_read_records=0`), each split into phases,
                then --repeat rebuilds over the same events: the runs' median time over the
                rebuilds', and whether the tables agree. `--only-dataframe-incremental` measures
                just this part; with --dir, the log of N events is kept there for the next call;
  * driver RSS (this Python process) and the Spark JVM's peak RSS; with the DataFrame rebuilds,
                each process's peak over that size's rebuilds alone (VmHWM reset before them).
The log is written a chunk at a time (numpy, Arrow, the log's compiled encoder). `--reuse` keeps each
size's log in --dir with its Parquet copies (and the TSV): a later run with the same sizes starts
at the rebuilds (a full run appends its incremental events, so its log is written anew next time).
Prints JSON and saves it to bench/results/projections.json.

    python bench/projections.py [--events 1000000,10000000] [--keys 100000] [--dsn DSN]
                                [--dataframe-only] [--profile] [--dir DIR --reuse]
    python bench/projections.py --only-dataframe-incremental --events 2000000 --incremental 10000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])

import numpy as np  # noqa: E402
import orjson  # noqa: E402
import psycopg  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from tributary.log.local import Log, TopicConfig, canonical_json, encode_plain, partition_for  # noqa: E402
from tributary.projections.engine import Item, fold_units  # noqa: E402
from tributary.projections.examples import account_balances  # noqa: E402
from tributary.projections.records import ProjectionRecord, default_event_time  # noqa: E402
from tributary.projections.runner import RunSettings, rebuild, run  # noqa: E402
from tributary.projections.source import columnar_segments, plan  # noqa: E402
from tributary.projections.spark import get_session  # noqa: E402

TOPIC = "events.account"
PARTS = 4
KINDS = ("MoneyDeposited", "MoneyDeposited", "MoneyWithdrawn")
GEN_CHUNK = 250_000  # events generated, appended and committed at a time


def write_events(log: Log, start: int, n: int, keys: int, rng: random.Random, tsv: Path | None) -> None:
    """Append n events (and write (stream, type, amount) lines for the Postgres baseline), built
    a chunk at a time by numpy and Arrow, encoded by the log's compiled encoder (`encode_plain`;
    one log timestamp per chunk and partition, as a capture batch has): the set-up of a 50M-event
    run is minutes, not hours. The values are JSON as `orjson.dumps` writes these dicts."""
    gen = np.random.default_rng(rng.getrandbits(64))
    part_of = np.array([partition_for(canonical_json(f"acc-{k}"), PARTS) for k in range(keys)], np.int8)
    out = tsv.open("wb") if tsv is not None else None
    for lo in range(start, start + n, GEN_CHUNK):
        i = np.arange(lo, min(lo + GEN_CHUNK, start + n), dtype=np.int64)
        account = gen.integers(keys, size=len(i))
        kind = np.where(i < keys, 3, i % 3)  # KINDS[i % 3], AccountOpened for the first `keys`
        amount = pc.binary_join_element_wise(
            _text(gen.integers(1, 100000, size=len(i))),
            pc.utf8_lpad(_text(gen.integers(100, size=len(i))), 2, "0"),
            ".",
        )
        at = 1_700_000_000_000 + i * 10 - gen.integers(0, 5000, size=len(i))
        iso = pa.array(np.datetime_as_string(at.astype("datetime64[ms]"), unit="ms")).cast(pa.string())
        stream = pc.binary_join_element_wise("acc-", _text(account), "")
        kinds = pa.array(np.array([*KINDS, "AccountOpened"])[kind])
        value = pc.binary_join_element_wise(
            '{"id":"e',
            _text(i),
            '","stream":"',
            stream,
            '","version":',
            _text(i),
            ',"type":"',
            kinds,
            '","schema_version":1,"data":{"amount":"',
            amount,
            '","owner":"o","overdraft_limit":"0"},"metadata":{},"occurred_at":"',
            iso,
            '+00:00","recorded_at":"',
            iso,
            '+00:00"}',
            "",
        ).cast(pa.binary())
        key = pc.binary_join_element_wise('"', stream, '"', "").cast(pa.binary())
        parts = part_of[account]
        for p in range(PARTS):
            rows = np.flatnonzero(parts == p)
            if not len(rows):
                continue
            ks, vs = key.take(rows).to_pylist(), value.take(rows).to_pylist()
            ts = int(at[rows].max())
            log.append_encoded(TOPIC, p, lambda first, ks=ks, vs=vs, ts=ts: encode_plain(first, ts, ks, vs), ts)
        log.commit()
        if out is not None:
            lines = pc.binary_join_element_wise(stream, kinds, amount, "\t")
            text = pc.binary_join_element_wise(lines, "", "\n").cast(pa.large_binary())
            offsets = np.frombuffer(text.buffers()[1], np.int64)[text.offset : text.offset + len(text) + 1]
            out.write(memoryview(text.buffers()[2])[offsets[0] : offsets[-1]])
    if out is not None:
        out.close()


def _text(a: np.ndarray) -> pa.Array:
    """Integers as their decimal text (an Arrow string array)."""
    return pa.array(a).cast(pa.string())


def python_fold(root: Path) -> tuple[float, int]:
    """Baseline (b): one process reads the whole log, groups it per key in log order, folds with
    the same engine (which merges a key's topic-partitions).
    Records are held compactly (raw bytes) and decoded once, while folding."""
    t0 = time.perf_counter()
    p = account_balances.PROJECTION
    held: list[tuple[bytes, int, str, int, int, int, bytes | None]] = []
    with Log.open(root) as log:
        for part in range(PARTS):
            for r in log.read(TOPIC, part):
                value = orjson.loads(r.value) if r.value is not None else None
                et = default_event_time(r.topic, value, r.timestamp)
                held.append((r.key or b"null", et, r.topic, r.partition, r.offset, r.timestamp, r.value))
    held.sort(key=lambda h: (h[0], h[2], h[3], h[4]))  # per key, log order: `Item.order`

    def items() -> Any:
        for key, et, topic, part, off, ts, value in held:
            k = key.decode()
            rec = ProjectionRecord(
                topic,
                part,
                off,
                ts,
                orjson.loads(key),
                None if value is None else orjson.loads(value),
                None,
                et,
            )
            yield Item(k, k, None, None, True, rec)

    n = sum(1 for _ in fold_units(p, items(), {}))
    return time.perf_counter() - t0, n


def pg_group_by(dsn: str, tsv: Path, repeat: int) -> list[float]:
    """Baseline (a): the DataFrame projection's aggregation as SQL inside Postgres (each run
    into an empty table)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_events, bench_totals")
        conn.execute("CREATE TABLE bench_events (stream text, type text, amount numeric(20,2))")
        with conn.cursor().copy("COPY bench_events FROM STDIN") as cp, tsv.open("rb") as f:
            while chunk := f.read(1 << 20):
                cp.write(chunk)
        conn.execute("VACUUM ANALYZE bench_events")
        conn.execute(
            "CREATE TABLE bench_totals (account_id text PRIMARY KEY, deposits numeric(20,2), "
            "withdrawals numeric(20,2), events bigint)"
        )
        took = []
        for _ in range(repeat):
            conn.execute("TRUNCATE bench_totals")
            t0 = time.perf_counter()
            conn.execute(
                "INSERT INTO bench_totals SELECT stream, "
                "coalesce(sum(amount) FILTER (WHERE type = 'MoneyDeposited'), 0), "
                "coalesce(sum(amount) FILTER (WHERE type = 'MoneyWithdrawn'), 0), count(*) "
                "FROM bench_events GROUP BY stream"
            )
            took.append(time.perf_counter() - t0)
        conn.execute("DROP TABLE bench_events, bench_totals")
    return took


DUCKDB_TOTALS = """
SELECT account_id,
       coalesce(sum(amount) FILTER (WHERE kind = 'MoneyDeposited'), 0)::DECIMAL(20,2) AS deposits,
       coalesce(sum(amount) FILTER (WHERE kind = 'MoneyWithdrawn'), 0)::DECIMAL(20,2) AS withdrawals,
       count(*) AS events
FROM (SELECT value ->> '$.stream' AS account_id, value ->> '$.type' AS kind,
             CAST(value ->> '$.data.amount' AS DECIMAL(20,2)) AS amount
      FROM read_parquet($files))
WHERE account_id IS NOT NULL
GROUP BY account_id
"""


def duckdb_totals(dsn: str, files: list[str], repeat: int) -> list[float]:
    """Baseline (c): `account_totals` computed by duckdb over the log's Parquet copies (the JSON
    text column `value`, as duckdb reads it), then COPYed as CSV into a new Postgres table with
    the primary key, committed — end to end, as a user of the duckdb wheel would do it."""
    import io

    import duckdb
    import pyarrow.csv as pacsv

    took = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        totals = duckdb.connect().sql(DUCKDB_TOTALS, params={"files": files}).to_arrow_table()
        buf = io.BytesIO()
        pacsv.write_csv(totals, buf, pacsv.WriteOptions(include_header=False))
        with psycopg.connect(dsn) as conn:
            conn.execute(
                "CREATE TABLE bench_duckdb (account_id text PRIMARY KEY, deposits numeric(20,2), "
                "withdrawals numeric(20,2), events bigint)"
            )
            with conn.cursor().copy("COPY bench_duckdb FROM STDIN (FORMAT csv)") as cp:
                cp.write(buf.getbuffer())
        took.append(time.perf_counter() - t0)
        with psycopg.connect(dsn, autocommit=True) as conn:
            differ = rows_differing(conn, "views.account_totals", "bench_duckdb")
            conn.execute("DROP TABLE bench_duckdb")
        if differ != 0:
            raise SystemExit(f"duckdb's table differs from the rebuild's in {differ} rows")
    return took


def rows_differing(conn: psycopg.Connection[Any], a: str, b: str) -> int:
    """Rows in one table and not the other, both ways (0: the same rows)."""
    row = conn.execute(
        f"SELECT count(*) FROM ((TABLE {a} EXCEPT TABLE {b}) UNION ALL (TABLE {b} EXCEPT TABLE {a})) d"
    ).fetchone()
    return -1 if row is None else int(row[0])


@contextmanager
def phases() -> Iterator[dict[str, float]]:
    """Seconds spent in the rebuild's steps (summed over calls), by wrapping the runner's and the
    store's functions for the length of the block: diagnostics for one rebuild."""
    from tributary.projections import runner as runner_mod
    from tributary.projections.store import Store

    spent: dict[str, float] = {}

    def timed(label: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0

        return wrapper

    patched: list[tuple[Any, str, Any]] = []
    targets = [
        (runner_mod, "_session", "session (+ executor check, once per app)"),
        (runner_mod, "_open_log", "open log"),
        (Store, "new_build", "new build tables"),
        (runner_mod, "_read", "plan splits + copies check + frame"),
        (runner_mod, "_transform_pass", "transform pass (total)"),
        (runner_mod, "output_lines", "COPY text (Arrow)"),
        (runner_mod, "distinct_keys", "distinct keys check"),
        (Store, "replace_rows", "replace_rows (total)"),
        (Store, "_copy_rows", "COPY into build table (a new build: its key added after)"),
        (Store, "set_status", "status updates"),
        (Store, "swap", "swap view"),
        (Store, "drop_build", "drop old build"),
    ]
    for owner, name, label in targets:
        original = owner.__dict__[name]
        fn = original.__func__ if isinstance(original, staticmethod) else original
        wrapped = timed(label, fn)
        setattr(owner, name, staticmethod(wrapped) if isinstance(original, staticmethod) else wrapped)
        patched.append((owner, name, original))
    try:
        yield spent
    finally:
        for owner, name, original in patched:
            setattr(owner, name, original)


def profile_rebuild(name: str, s: RunSettings, spark: Any, files: list[str]) -> dict[str, float]:
    """One rebuild split into phases (see `phases`); `spark: read + aggregate + collect` is the
    transform pass minus its measured parts. Also, apart: Spark reading the projection's three
    VARIANT fields from the copies alone (no aggregation, `noop` sink)."""
    from pyspark.sql import functions as F

    with phases() as spent:
        total = rebuild(name, s, spark=spark).seconds
    parts = ("plan splits + copies check + frame", "COPY text (Arrow)", "distinct keys check", "replace_rows (total)")
    out = {k: round(v, 3) for k, v in spent.items()}
    out["spark: read + aggregate + collect"] = round(
        spent["transform pass (total)"] - sum(spent.get(k, 0.0) for k in parts), 3
    )
    out["rebuild (total)"] = round(total, 3)
    t0 = time.perf_counter()
    spark.read.parquet(*files).select(
        F.expr("variant_get(value_v, '$.stream', 'string')"),
        F.expr("variant_get(value_v, '$.type', 'string')"),
        F.expr("variant_get(value_v, '$.data.amount', 'decimal(20,2)')"),
    ).write.format("noop").mode("overwrite").save()
    out["apart: Spark reads 3 VARIANT fields of the copies"] = round(time.perf_counter() - t0, 3)
    return out


def rss_now_mb() -> float:
    """This process's resident set now (VmRSS): the driver's memory after a size's runs."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def jvm_pid(spark: Any) -> int | None:
    try:
        return int(spark._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:  # diagnostics only
        return None


def peak_rss_mb(pid: int | str | None = "self") -> float | None:
    """A process's peak resident set (VmHWM) since it started or since `reset_peak_rss`."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def reset_peak_rss(pid: int | str | None = "self") -> None:
    """Start a process's VmHWM afresh (Linux `clear_refs` 5): a size's rebuild peak is then its own,
    not the log generator's nor a smaller size's."""
    if pid is None:
        return
    with suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def jvm_peak_rss_mb(spark: Any) -> float | None:
    return peak_rss_mb(jvm_pid(spark))


def reused_log(root: Path, n: int, tsv: Path | None) -> Log | None:
    """The log an earlier run left in `root` (`--reuse`) when it holds exactly n committed events
    of TOPIC (and the baseline's TSV, when one is needed); else None and nothing is kept."""
    if not (root / TOPIC).is_dir() or (tsv is not None and not tsv.exists()):
        return None
    log = Log.open(root, writer=True)
    if sum(e.end for (topic, _), e in log.ends().items() if topic == TOPIC) == n:
        return log
    log.close()
    return None


def one_size(
    n: int,
    keys: int,
    dsn: str,
    work: Path,
    spark: Any,
    incremental: int,
    py_max: int,
    repeat: int,
    *,
    dataframe_only: bool = False,
    profile: bool = False,
    reuse: bool = False,
) -> dict[str, Any]:
    rng = random.Random(n)
    root = work / f"log_{n}"
    tsv = work / f"events_{n}.tsv"
    t0 = time.perf_counter()
    log = reused_log(root, n, None if dataframe_only else tsv) if reuse else None
    reused = log is not None
    if log is None:
        shutil.rmtree(root, ignore_errors=True)
        log = Log.open(root, writer=True)
        log.create_topic(TOPIC, TopicConfig(partitions=PARTS))
        write_events(log, 0, n, keys, rng, None if dataframe_only else tsv)
    write_s = time.perf_counter() - t0
    json_module = work / "account_totals_json.py"
    json_module.write_text(
        "from tributary.projections.examples.account_totals import make\n"
        'PROJECTION = make(name="account_totals_json", from_json=True)\n'
    )
    s = RunSettings(
        dsn=dsn,
        log_root=root,
        modules=(
            "tributary.projections.examples.account_balances",
            "tributary.projections.examples.account_totals",
            str(json_module),
        ),
        spark_master=spark.sparkContext.master,
        shuffle_partitions=8,
    )
    # Parquet copies of the sealed segments, and of the active segments' committed prefixes
    # (tail copies): made once by the runner's Spark tasks (in steady state by the incremental
    # runs as segments seal, by a rebuild or a DataFrame projection's run for the tails); timed
    # on their own.
    log_ends = log.ends()
    _, sealed = plan(log, [TOPIC], {}, {tp: e.end for tp, e in log_ends.items()}, 16 << 20)
    t0 = time.perf_counter()
    columnar, _ = columnar_segments(spark, log, sealed)
    columnar_s = time.perf_counter() - t0
    assert len(columnar) == len(sealed)
    sealed_records = sum(e.segment for e in log_ends.values())  # offsets before each active segment
    sealed_records += sum(s.tail.end - s.tail.base for s in columnar if s.tail is not None)
    files = [str(c.copy_path) for c in columnar]
    # Ours and duckdb's alternate, so that a change in the machine's load hits both alike. The
    # first rebuild in a new JVM is apart (cold: the JIT has not compiled the scan yet).
    jvm = jvm_pid(spark)
    df_runs, duck_runs = [], []
    reset_peak_rss()
    reset_peak_rss(jvm)
    cold = rebuild("account_totals", s, spark=spark).seconds
    for _ in range(repeat):
        df_runs.append(rebuild("account_totals", s, spark=spark).seconds)
        driver_peak = peak_rss_mb()  # the rebuilds' alone: duckdb runs in this process too
        duck_runs += duckdb_totals(dsn, files, 1)
    vs_duckdb = {
        "log_write_s": round(write_s, 2),
        "log_reused": reused,
        "columnar_copies_s": round(columnar_s, 2),
        "dataframe_cold_rebuild_s": round(cold, 2),
        "dataframe_events_per_s": round(n / median(df_runs)),
        "duckdb_events_per_s": round(n / median(duck_runs)),
        "rebuild_driver_peak_rss_mb": driver_peak,
        "rebuild_jvm_peak_rss_mb": peak_rss_mb(jvm),
        "duckdb_copy_s": round(median(duck_runs), 2),
        "duckdb_copy_runs_s": [round(x, 2) for x in duck_runs],
        "dataframe_vs_duckdb": round(median(df_runs) / median(duck_runs), 2),
        "parquet_copy_files": len(files),
    }
    if profile:
        vs_duckdb["dataframe_rebuild_phases_s"] = profile_rebuild("account_totals", s, spark, files)
    if dataframe_only:
        log.close()
        return {
            "events": n,
            "keys": keys,
            "records_in_parquet_fraction": round(sealed_records / n, 3),
            "dataframe_rebuild_s": round(median(df_runs), 2),
            "dataframe_rebuild_runs_s": [round(x, 2) for x in df_runs],
            **vs_duckdb,
            "runner_driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "driver_rss_now_mb": rss_now_mb(),
        }
    fold = rebuild("account_balances", s, spark=spark)
    df_json = rebuild("account_totals_json", s, spark=spark)
    with psycopg.connect(dsn) as conn:
        differ = rows_differing(conn, "views.account_totals", "views.account_totals_json")
    write_events(log, n, incremental, keys, rng, None)
    log.close()
    inc = run("account_balances", s, spark=spark)
    runner_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the baselines
    pg_runs = pg_group_by(dsn, tsv, repeat)
    if not reuse:
        tsv.unlink()
    py_s, py_units = python_fold(root) if n <= py_max else (None, None)
    return {
        **vs_duckdb,
        "events": n,
        "keys": keys,
        "records_in_parquet_fraction": round(sealed_records / n, 3),
        "fold_rebuild_s": round(fold.seconds, 2),
        "fold_events_per_s": round(n / fold.seconds),
        "dataframe_rebuild_s": round(median(df_runs), 2),
        "dataframe_rebuild_runs_s": [round(x, 2) for x in df_runs],
        "dataframe_json_rebuild_s": round(df_json.seconds, 2),
        "dataframe_tables_equal": differ == 0,
        "pg_group_by_s": round(median(pg_runs), 2),
        "pg_group_by_runs_s": [round(x, 2) for x in pg_runs],
        "py_fold_s": None if py_s is None else round(py_s, 2),
        "py_fold_units": py_units,
        "dataframe_vs_pg": round(median(pg_runs) / median(df_runs), 3),
        "dataframe_vs_pg_first_runs": round(pg_runs[0] / df_runs[0], 3),
        "dataframe_json_vs_pg": round(median(pg_runs) / df_json.seconds, 3),
        "fold_vs_py": None if py_s is None else round(py_s / fold.seconds, 3),
        "incremental_events": incremental,
        "incremental_s": round(inc.seconds, 2),
        "incremental_recomputed_units": inc.recomputed,
        "runner_driver_peak_rss_mb": round(runner_rss, 1),
    }


def _run_phases(name: str, s: RunSettings, spark: Any) -> tuple[Any, dict[str, float]]:
    """One incremental `run` split into phases (`phases`, plus the merge and the driver read);
    `spark: build + collect` is the transform pass minus its measured parts."""
    from tributary.projections import runner as runner_mod
    from tributary.projections.store import Store

    extra = [(Store, "merge_rows", "merge_rows (total)"), (runner_mod, "driver_frame", "driver read + frame")]
    with phases() as spent:
        originals = [(owner, attr, owner.__dict__[attr]) for owner, attr, _ in extra]
        for owner, attr, label in extra:
            fn = owner.__dict__[attr]

            def wrapper(*args: Any, _fn: Any = fn, _label: str = label, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return _fn(*args, **kwargs)
                finally:
                    spent[_label] = spent.get(_label, 0.0) + time.perf_counter() - t0

            setattr(owner, attr, wrapper)
        try:
            result = run(name, s, spark=spark)
        finally:
            for owner, attr, original in originals:
                setattr(owner, attr, original)
    parts = ("plan splits + copies check + frame", "driver read + frame", "COPY text (Arrow)", "merge_rows (total)")
    out = {k: round(v, 3) for k, v in spent.items()}
    if "transform pass (total)" in spent:
        out["spark: build + collect"] = round(
            spent["transform pass (total)"] - sum(spent.get(k, 0.0) for k in parts), 3
        )
    out["run (total)"] = round(result.seconds, 3)
    return result, out


def dataframe_incremental(
    n: int, keys: int, dsn: str, work: Path, spark: Any, incremental: int, repeat: int
) -> dict[str, Any]:
    """`account_totals` over N events, then `repeat` incremental runs each after `incremental`
    more — alternately with the new records read by Spark tasks (`driver_read_records=0`) and in
    the driver (the default) — then `repeat` rebuilds over them all (same run): an incremental run
    must cost a small part of a rebuild (medians) and leave the table the rebuild makes. The log
    of N events (with its Parquet copies) is kept in `work` and reused by a later call there."""
    rng = random.Random(n + 1)
    root = work / f"log_df_{n}"
    kept = work / f"log_df_{n}.kept"
    shutil.rmtree(root, ignore_errors=True)
    s = RunSettings(
        dsn=dsn,
        log_root=root,
        modules=("tributary.projections.examples.account_totals",),
        spark_master=spark.sparkContext.master,
        shuffle_partitions=8,
    )
    reused = kept.exists()
    if reused:
        shutil.copytree(kept, root)
        log = Log.open(root, writer=True)
        first = rebuild("account_totals", s, spark=spark)
    else:
        log = Log.open(root, writer=True)
        log.create_topic(TOPIC, TopicConfig(partitions=PARTS))
        write_events(log, 0, n, keys, rng, None)
        first = rebuild("account_totals", s, spark=spark)  # also makes the sealed segments' Parquet copies
        shutil.copytree(root, kept)
    spark_read = replace(s, driver_read_records=0)
    incs, spark_incs, profiles = [], [], {}
    for _ in range(repeat):
        for label, settings in (("spark_read", spark_read), ("driver_read", s)):
            write_events(log, n + (len(incs) + len(spark_incs)) * incremental, incremental, keys, rng, None)
            result, profile = _run_phases("account_totals", settings, spark)
            (incs if settings is s else spark_incs).append(result)
            profiles[label] = profile  # the last run's
    log.close()
    inc = incs[-1]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS public.bench_incremental")
        conn.execute("CREATE TABLE public.bench_incremental AS TABLE views.account_totals")
    fulls = [rebuild("account_totals", s, spark=spark) for _ in range(repeat)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        differ = rows_differing(conn, "views.account_totals", "public.bench_incremental")
        conn.execute("DROP TABLE public.bench_incremental")
    shutil.rmtree(root, ignore_errors=True)
    rebuild_s = median(r.seconds for r in fulls)
    return {
        "events": n,
        "keys": keys,
        "first_rebuild_s": round(first.seconds, 2),
        "first_rebuild_reused_copies": reused,
        "incremental_events": incremental,
        "incremental_records_read": inc.records,
        "incremental_rows_merged": inc.rows,
        "incremental_s": round(median(r.seconds for r in incs), 2),
        "incremental_runs_s": [round(r.seconds, 2) for r in incs],
        "incremental_spark_read_s": round(median(r.seconds for r in spark_incs), 2),
        "incremental_spark_read_runs_s": [round(r.seconds, 2) for r in spark_incs],
        "rebuild_s": round(rebuild_s, 2),
        "rebuild_runs_s": [round(r.seconds, 2) for r in fulls],
        "incremental_over_rebuild": round(median(r.seconds for r in incs) / rebuild_s, 3),
        "incremental_spark_read_over_rebuild": round(median(r.seconds for r in spark_incs) / rebuild_s, 3),
        "phases_s": profiles,
        "tables_equal": differ == 0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", default="1000000,10000000", help="comma-separated sizes")
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--incremental", type=int, default=10_000)
    ap.add_argument("--py-max", type=int, default=5_000_000, help="skip the Python baseline above this size")
    ap.add_argument("--repeat", type=int, default=3, help="runs of the DataFrame rebuild and of the GROUP BY")
    ap.add_argument(
        "--dataframe-only", action="store_true", help="only the DataFrame rebuild and duckdb (no fold, pg, py)"
    )
    ap.add_argument("--profile", action="store_true", help="also one DataFrame rebuild split into phases")
    ap.add_argument("--dsn", help="service database (default: an embedded cluster in --dir)")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument(
        "--reuse",
        action="store_true",
        help="keep each size's log (and its Parquet copies) in --dir and use it again in later runs",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "projections.json")
    ap.add_argument(
        "--only-dataframe-incremental", action="store_true", help="measure only the incremental DataFrame run"
    )
    args = ap.parse_args()
    if args.reuse and args.dir is None:
        ap.error("--reuse needs --dir (where the logs are kept)")
    work = args.dir or Path(tempfile.mkdtemp(prefix="tributary-bench-proj-"))
    cluster = None
    dsn = args.dsn
    if dsn is None:
        from tributary.api.devdb.embedded import EmbeddedPostgres

        shutil.rmtree(work / "pg", ignore_errors=True)  # a killed run's
        cluster = EmbeddedPostgres(work / "pg")
        cluster.up()
        dsn = cluster.dsn()
    spark = get_session(args.master, shuffle_partitions=8)
    warm = spark.range(1000, numPartitions=8)  # JVM and Python-worker start-up are not what we measure
    warm.groupBy((warm.id % 7).alias("k")).count().collect()
    warm.mapInArrow(lambda batches: batches, "id long").collect()
    load_before = os.getloadavg()
    try:
        if args.only_dataframe_incremental:
            only = [
                dataframe_incremental(int(n), args.keys, dsn, work, spark, args.incremental, args.repeat)
                for n in args.events.split(",")
            ]
            text = json.dumps({"bench": "projections", "master": args.master, "dataframe_incremental": only}, indent=2)
            print(text)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.with_name("projections_dataframe_incremental.json").write_text(text + "\n")
            return
        sizes = [
            {
                **one_size(
                    int(n),
                    args.keys,
                    dsn,
                    work,
                    spark,
                    args.incremental,
                    args.py_max,
                    args.repeat,
                    dataframe_only=args.dataframe_only,
                    profile=args.profile,
                    reuse=args.reuse,
                ),
                **(
                    {}
                    if args.dataframe_only
                    else {
                        "dataframe_incremental": dataframe_incremental(
                            int(n), args.keys, dsn, work, spark, args.incremental, args.repeat
                        )
                    }
                ),
            }
            for n in args.events.split(",")
        ]
        result: dict[str, Any] = {
            "bench": "projections",
            "master": args.master,
            "cpus": os.cpu_count(),
            "sizes": sizes,
            "process_peak_rss_mb_incl_py_baseline": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "jvm_peak_rss_mb": jvm_peak_rss_mb(spark),
            "load_average_before_after": [round(x, 2) for x in (*load_before, *os.getloadavg())],
            "timing": (
                "wall clock (perf_counter) in this process, warm (a JVM warm-up job first); DataFrame: the "
                "whole `rebuild` call (new build, plan, Spark read + aggregation, COPY into the build table, "
                "checkpoints, view swap, old build dropped); GROUP BY: the one INSERT ... SELECT ... GROUP BY "
                "statement into an empty table with the same primary key, over bench_events(stream, type, "
                "amount numeric(20,2)) holding the same events (loaded by COPY and VACUUM ANALYZEd beforehand, "
                "not timed); both outputs 100 % of the keys, same sums"
            ),
        }
        if len(sizes) > 1 and not args.dataframe_only:
            a, b = sizes[0], sizes[-1]
            result["fold_time_ratio"] = round(b["fold_rebuild_s"] / a["fold_rebuild_s"], 2)
            result["size_ratio"] = round(b["events"] / a["events"], 2)
        text = json.dumps(result, indent=2)
        print(text)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    finally:
        spark.stop()
        if cluster is not None:
            cluster.destroy()
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
