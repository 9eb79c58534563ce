"""One SparkSession per process, from config, tuned for a small machine.

UI off, AQE off, quiet logs and a loopback address keep start-up short; shuffles have one
partition per task slot unless told otherwise; `conf` (`[projections] spark_conf`) is applied
last, so any of them can be overridden (a cluster sets `spark.driver.host` to an address its
executors can reach: a loopback one with a master on another host is refused).
Python workers do not see `sys.path` edits: they import `tributary` from the installed package,
and the driver's PYTHONPATH (if any) travels to them as `spark.executorEnv.PYTHONPATH`.
Spark's own Kafka source, when `make setup` has fetched it (build/spark-kafka/lib), is on every
session's classpath (`spark.jars`, after any the configuration names), as a Spark distribution's
bundled connectors are: `[projections] kafka_reader = "spark"` reads through it.

The JVM writes to its standard error on its own (`WARNING: Using incubator modules`, Spark's
"Setting default log level" hint, log4j lines, task failures' Java stack traces), and its Python
workers inherit that stream. None of it is for a terminal: the JVM is started with its standard
error on a file (`jvm_log`, set by `log_jvm_to`), where log4j also writes (warnings and up).
That file is rotated when a JVM starts: past `JVM_LOG_BYTES` it becomes `<name>.1` (replacing the
previous one), so it never holds more than one run's output beyond the cap.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "JVM_LOG_BYTES",
    "aggregation_session",
    "get_session",
    "jvm_log",
    "local_cores",
    "log_jvm_to",
    "rotate",
    "stop_session",
]

JVM_LOG_BYTES = 10 << 20  # the JVM's log is rotated past this size when a session starts

_LOCK = threading.Lock()
_SESSION: SparkSession | None = None
_JVM_LOG: Path | None = None

# The repl logger at the root's level: Spark prints its "sc.setLogLevel" hint when they differ.
_LOG4J = """\
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = warn
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yyyy-MM-dd HH:mm:ss} %p %c{1}: %m%n
"""


def _quiet_log4j() -> str:
    path = Path(tempfile.gettempdir()) / f"tributary-log4j2-{os.getuid()}.properties"
    if not path.exists() or path.read_text() != _LOG4J:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_LOG4J)
        tmp.replace(path)
    return str(path)


def log_jvm_to(path: Path) -> None:
    """Where the JVM started by the next `get_session` writes its standard error (appended)."""
    global _JVM_LOG
    _JVM_LOG = path


def jvm_log() -> Path:
    """The JVM's standard error: the file `log_jvm_to` named, else one in the temp directory."""
    return _JVM_LOG or Path(tempfile.gettempdir()) / f"tributary-spark-{os.getuid()}.log"


def rotate(path: Path, max_bytes: int) -> None:
    """Move `path` to `<path>.1` (replacing an older one) once it holds `max_bytes` or more: a
    rename, so a process still appending to it (another run's JVM) keeps writing, to the old file."""
    try:
        if path.stat().st_size >= max_bytes:
            path.replace(path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass


@contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Point file descriptor 2 at `path` while a child process starts: the child keeps it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


def get_session(
    master: str = "local[*]", *, shuffle_partitions: int | None = None, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """The process's SparkSession (created on first use; later calls return the same one).
    `conf` goes on top of the defaults: its settings win. Shuffles use `shuffle_partitions`, else a
    local master's task slots (a cluster's are known once its executors register: the runner sets
    them then). A loopback driver address with a master on another host is refused (`RunError`)."""
    global _SESSION
    with _LOCK:
        if _SESSION is not None:
            return _SESSION
        from tributary.projections.cluster import loopback_driver
        from tributary.projections.errors import RunError

        refused = loopback_driver(master, conf or {})
        if refused is not None:
            raise RunError(refused)
        partitions = shuffle_partitions if shuffle_partitions is not None else local_cores(master)
        pythonpath = os.environ.get("PYTHONPATH", "")
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this venv's packages
        os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
        from pyspark.sql import SparkSession

        log4j = _quiet_log4j()
        builder = (
            SparkSession.builder.master(master)
            .appName("tributary-projections")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.adaptive.enabled", "false")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
            .config("spark.executor.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log4j}")
            .config("spark.python.worker.reuse", "true")
            # local mode runs the tasks in this JVM: the default 1 GB made a large fold's sort spill
            # to disk; the heap grows only as needed
            .config("spark.driver.memory", "3g")
            .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
            # Parquet copies hold the value as a VARIANT, shredded into typed columns by the
            # writer; a `variant_get` over it reads only the columns it names.
            .config("spark.sql.variant.writeShredding.enabled", "true")
            .config("spark.sql.variant.inferShreddingSchema", "true")
            .config("spark.sql.variant.allowReadingShredded", "true")
            .config("spark.sql.variant.pushVariantIntoScan", "true")
            .config("spark.sql.variant.pushVariantIntoScan.pullOutExtractions", "true")
        )
        if pythonpath:
            builder = builder.config("spark.executorEnv.PYTHONPATH", pythonpath)
        if partitions is not None:
            builder = builder.config("spark.sql.shuffle.partitions", str(partitions))
        if local_cores(master) is None:  # the first job waits for every core of spark.cores.max (if set)
            builder = builder.config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        for k, v in (conf or {}).items():
            builder = builder.config(k, v)
        jars = _jars(conf or {})
        if jars:
            builder = builder.config("spark.jars", jars)
        rotate(jvm_log(), JVM_LOG_BYTES)
        with _stderr_to(jvm_log()):
            session = builder.getOrCreate()
        _SESSION = session
        return session


def _jars(conf: Mapping[str, str]) -> str:
    """`spark.jars`: the configuration's, then Spark's Kafka source's (when fetched)."""
    from tributary.projections.spark_kafka_source import connector_jars

    return ",".join([*filter(None, [conf.get("spark.jars")]), *connector_jars()])


def has_session() -> bool:
    """Whether this process's session exists (False while it is still starting)."""
    return _SESSION is not None


def cancel_jobs() -> None:
    """Cancel the session's running jobs, if there is a session: whoever waits on one gets an
    error at once (a process that is stopping need not wait for a pass to finish)."""
    session = _SESSION  # not under _LOCK: that is held while a session starts, which may take long
    if session is not None:
        session.sparkContext.cancelAllJobs()


def stop_session() -> None:
    global _SESSION
    with _LOCK:
        if _SESSION is not None:
            _SESSION.stop()
            _SESSION = None


def local_cores(master: str | None) -> int | None:
    """The task slots of a `local`, `local[n]` or `local[*]` master (None for a cluster, and for
    a context that names no master)."""
    if master is None:
        return None
    if master == "local":
        return 1
    if master.startswith("local[") and master.endswith("]"):
        n = master[6:-1].split(",")[0]  # local[n, maxFailures] too
        if n == "*":
            return os.cpu_count() or 1
        return int(n) if n.isdigit() and int(n) > 0 else None
    return None


def aggregation_session(spark: SparkSession, shuffle_partitions: int) -> SparkSession:
    """A session sharing `spark`'s context whose shuffles (a DataFrame projection's groupBy) use
    at most one partition per local task slot. After the map side's partial aggregation the
    reduce side holds at most one row per group, so more partitions than slots add only per-task
    work. The fold keeps `shuffle_partitions` (its sorts hold every record)."""
    cores = local_cores(spark.sparkContext.master)
    wanted = shuffle_partitions if cores is None else max(1, min(shuffle_partitions, cores))
    current = spark.conf.get("spark.sql.shuffle.partitions")  # never None: Spark has a default
    if current is not None and int(current) == wanted:
        return spark
    session = spark.newSession()
    session.conf.set("spark.sql.shuffle.partitions", str(wanted))
    return session
