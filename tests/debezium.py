"""Debezium's PostgreSQL connector in Kafka Connect (standalone), the reference for our envelope.

The jars come from `make setup` (deploy/debezium/pom.xml → build/debezium/lib). `run_debezium`
starts one worker on loopback against a real Kafka cluster and a real database, waits on progress
(its log growing, then the REST status and its replication slot), and stops it after the test.

`CONNECTOR_SETTINGS` is the one place that says how Debezium is configured so that its records
come as close to tributary's as its settings allow; docs/envelope.md ("Compared with Debezium")
lists the same settings and what still differs. The module imports no pytest: `bench/capture.py
--peer debezium` runs Debezium through it with the same settings.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

from tests.pg import REPO_ROOT
from tests.waiting import size_of, wait_exit, wait_progress
from tributary.api.devdb import free_port

__all__ = [
    "CONNECTOR_SETTINGS",
    "DEBEZIUM_LIB",
    "DEBEZIUM_PREFIX",
    "SLOT",
    "DebeziumConnect",
    "CONNECT_JVM",
    "run_debezium",
    "run_jdbc_sink",
]

DEBEZIUM_LIB = REPO_ROOT / "build" / "debezium" / "lib"
DEBEZIUM_PREFIX = "dbz"  # Debezium's topics are renamed from `<source>.…` to `dbz.…` (beside ours, same cluster)
SLOT = "debezium"
PUBLICATION = "debezium_pub"
CONNECTOR = "oracle"

# Debezium settings under which its values match tributary's where they can: each is the choice
# closest to what tributary writes (docs/envelope.md, "Compared with Debezium").
CONNECTOR_SETTINGS: dict[str, str] = {
    "decimal.handling.mode": "string",  # numeric → its exact digits as a string
    "time.precision.mode": "isostring",  # date, time, timestamp → ISO-8601 text
    "binary.handling.mode": "hex",  # bytea → hex string
    "interval.handling.mode": "string",  # interval → ISO-8601 duration text (ours: PostgreSQL's text)
    "hstore.handling.mode": "json",
    "unavailable.value.placeholder": "__tributary_unavailable__",  # unchanged TOAST → our placeholder
    "skipped.operations": "none",  # Debezium skips truncates unless told otherwise
    "tombstones.on.delete": "true",  # a delete is followed by a tombstone, as ours
    "include.unknown.datatypes": "true",  # types it has no mapping for, rather than leaving the column out
}

_JVM = ["-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]
# What Kafka's `connect-standalone.sh` runs the worker with (KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS):
# the JIT and GC as shipped, for measuring speed (the tests' `_JVM` trades speed for a quick start).
CONNECT_JVM = [
    "-Xms256m",
    "-Xmx2g",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
]
_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
"""


@dataclass
class DebeziumConnect:
    """A running Connect worker with one Debezium connector."""

    proc: subprocess.Popen[bytes]
    rest_port: int
    log: Path
    dsn: str
    ready_after_s: float = 0.0  # from the JVM's start to its snapshot done and streaming
    connector: str = CONNECTOR
    slot: str = SLOT

    def status(self) -> dict[str, Any] | None:
        """The connector's REST status, or None while the REST server does not answer it."""
        url = f"http://127.0.0.1:{self.rest_port}/connectors/{self.connector}/status"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                doc: dict[str, Any] = json.loads(answer.read())
                return doc
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def running(self) -> bool:
        """The connector and its one task report RUNNING (a FAILED one fails the wait with its trace)."""
        doc = self.status()
        if doc is None:
            return False
        states = [doc["connector"]["state"], *(t["state"] for t in doc.get("tasks", []))]
        if "FAILED" in states:
            traces = [t.get("trace", "") for t in doc.get("tasks", [])] + [doc["connector"].get("trace", "")]
            raise AssertionError(f"Debezium failed: {next((t for t in traces if t), states)[:2000]}")
        return len(states) == 2 and all(s == "RUNNING" for s in states)

    def streaming(self) -> bool:
        """Debezium's slot is in use: its snapshot is done and it reads the stream."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (self.slot,)).fetchone()
        return bool(row and row[0])

    def alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"Kafka Connect exited ({self.proc.returncode}): {self.tail()}")

    def tail(self) -> str:
        """The last error in the worker's log (or its last line)."""
        lines = self.log.read_text(errors="replace").strip().splitlines() if self.log.exists() else []
        errors = [line for line in lines if " ERROR " in line]
        return (errors or lines or ["no log"])[-1][:2000]


def _jdbc_parts(dsn: str) -> dict[str, str]:
    """The connector's database settings from a libpq URL DSN (the tests' `postgresql://user@host:port/db`)."""
    parts = urlsplit(dsn)
    return {
        "database.hostname": parts.hostname or "127.0.0.1",
        "database.port": str(parts.port or 5432),
        "database.user": parts.username or "postgres",
        "database.password": parts.password or "",
        "database.dbname": parts.path.lstrip("/"),
    }


def connector_properties(dsn: str, source: str, tables: list[str]) -> dict[str, str]:
    """The connector's settings: pgoutput with its own slot and publication, topics `<source>.schema.table`
    renamed to `dbz.schema.table` (so `source.name` is `source`, as in ours), 3 partitions per topic."""
    return {
        "name": CONNECTOR,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        **_jdbc_parts(dsn),
        "plugin.name": "pgoutput",
        "slot.name": SLOT,
        "publication.name": PUBLICATION,
        "publication.autocreate.mode": "filtered",
        "table.include.list": ",".join(tables),
        "topic.prefix": source,
        "snapshot.mode": "initial",
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "3",
        "transforms": "rename",
        "transforms.rename.type": "org.apache.kafka.connect.transforms.RegexRouter",
        "transforms.rename.regex": f"{source}\\.(.*)",
        "transforms.rename.replacement": f"{DEBEZIUM_PREFIX}.$1",
        **CONNECTOR_SETTINGS,
    }


def worker_properties(bootstraps: str, workdir: Path, rest_port: int, *, schemas: bool = False) -> dict[str, str]:
    """A standalone worker on loopback: JSON (without schemas unless `schemas`), offsets in a file under `workdir`."""
    return {
        "bootstrap.servers": bootstraps,
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": str(schemas).lower(),
        "value.converter.schemas.enable": str(schemas).lower(),
        "offset.storage.file.filename": str(workdir / "offsets.dat"),
        "offset.flush.interval.ms": "1000",
        "listeners": f"http://127.0.0.1:{rest_port}",
        "rest.advertised.host.name": "127.0.0.1",
        "plugin.discovery": "only_scan",
    }


def _properties(values: dict[str, str]) -> str:
    """A Java .properties file (backslashes escaped)."""
    return "".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in values.items())


def _classpath() -> str:
    jars = sorted(DEBEZIUM_LIB.glob("*.jar"))
    if not any(j.name.startswith("debezium-connector-postgres-") for j in jars):
        raise AssertionError(f"Debezium's jars are not in {DEBEZIUM_LIB}: run `make setup`")
    return ":".join(str(j) for j in jars)


@contextlib.contextmanager
def run_debezium(
    dsn: str,
    bootstraps: str,
    workdir: Path,
    *,
    source: str,
    tables: list[str],
    overrides: dict[str, str] | None = None,
    jvm: list[str] | None = None,
    wait_ready: bool = True,
) -> Iterator[DebeziumConnect]:
    """Kafka Connect standalone with Debezium on `dsn` (tables `schema.table`), writing to `bootstraps`;
    yields once its snapshot is done and it streams (at once if not `wait_ready`: a benchmark times
    that itself); stopped (then killed) after. `overrides` replace connector settings (slot, snapshot
    mode, partitions), `jvm` the worker's JVM options; offsets stay in `workdir` across runs."""
    workdir.mkdir(parents=True, exist_ok=True)
    rest_port = free_port()
    worker = workdir / "worker.properties"
    worker.write_text(_properties(worker_properties(bootstraps, workdir, rest_port)))
    connector = workdir / "connector.properties"
    properties = {**connector_properties(dsn, source, tables), **(overrides or {})}
    connector.write_text(_properties(properties))
    proc, log = _start(workdir, worker, connector, jvm=jvm)
    started = time.monotonic()
    connect = DebeziumConnect(proc, rest_port, log, dsn, slot=properties["slot.name"])
    try:

        def ready() -> bool:
            connect.alive()
            return connect.running() and connect.streaming()

        if wait_ready:
            wait_progress(ready, lambda: size_of(log), what="Debezium to snapshot and stream", poll=0.5)
        connect.ready_after_s = time.monotonic() - started
        yield connect
    finally:
        _stop(proc)


SINK = "jdbc-sink"


def sink_properties(target_dsn: str, topics_regex: str, rename: tuple[str, str]) -> dict[str, str]:
    """Debezium's JDBC sink into `target_dsn`: upserts by the record key, deletes, truncates, tables named after
    the topics (`rename`: a RegexRouter's regex and replacement). `stringtype=unspecified` lets the
    server type the string values Debezium's JSON carries (dates, uuids, numerics) by their column."""
    parts = urlsplit(target_dsn)
    host, port, db = parts.hostname or "127.0.0.1", parts.port or 5432, parts.path.lstrip("/")
    return {
        "name": SINK,
        "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector",
        "tasks.max": "1",
        "connection.url": f"jdbc:postgresql://{host}:{port}/{db}?stringtype=unspecified",
        "connection.username": parts.username or "postgres",
        "connection.password": parts.password or "",
        "insert.mode": "upsert",
        "delete.enabled": "true",
        "truncate.enabled": "true",
        "primary.key.mode": "record_key",
        "schema.evolution": "basic",
        "database.time_zone": "UTC",
        "topics.regex": topics_regex,
        "transforms": "rename",
        "transforms.rename.type": "org.apache.kafka.connect.transforms.RegexRouter",
        "transforms.rename.regex": rename[0],
        "transforms.rename.replacement": rename[1],
    }


@contextlib.contextmanager
def run_jdbc_sink(
    target_dsn: str, bootstraps: str, workdir: Path, *, topics_regex: str, rename: tuple[str, str]
) -> Iterator[DebeziumConnect]:
    """Kafka Connect standalone (JSON with schemas) with Debezium's JDBC sink reading `topics_regex`
    into `target_dsn`; yields once the connector and its task run; stopped (then killed) after."""
    workdir.mkdir(parents=True, exist_ok=True)
    rest_port = free_port()
    worker = workdir / "worker.properties"
    worker.write_text(_properties(worker_properties(bootstraps, workdir, rest_port, schemas=True)))
    connector = workdir / "connector.properties"
    connector.write_text(_properties(sink_properties(target_dsn, topics_regex, rename)))
    proc, log = _start(workdir, worker, connector)
    connect = DebeziumConnect(proc, rest_port, log, target_dsn, connector=SINK)
    try:

        def ready() -> bool:
            connect.alive()
            return connect.running()

        wait_progress(ready, lambda: size_of(log), what="the JDBC sink to run", poll=0.5)
        yield connect
    finally:
        _stop(proc)


def _start(
    workdir: Path, worker: Path, connector: Path, *, jvm: list[str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    """The worker's JVM (`jvm` options, else the tests' quick-start ones), its output into `workdir`/connect.log."""
    log4j = workdir / "log4j2.properties"
    log4j.write_text(_LOG4J2)
    log = workdir / "connect.log"
    cmd = [
        "java",
        *(jvm or _JVM),
        f"-Dlog4j2.configurationFile={log4j}",
        "-cp",
        _classpath(),
        "org.apache.kafka.connect.cli.ConnectStandalone",
        str(worker),
        str(connector),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
    return proc, log


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (Connect stops its task and commits offsets), SIGKILL if it lingers."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            wait_exit(proc, what="Kafka Connect to stop", stall=60, ceiling=120)
        except AssertionError:
            proc.kill()
            proc.wait()
