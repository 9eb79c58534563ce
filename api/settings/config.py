"""Configuration: `tributary.toml` + `TRIBUTARY_<SECTION>__<KEY>` environment overrides.

Frozen at the edge (the CLI loads it once) and passed down as plain values; nothing deeper reads
the environment. Key names are a contract (users' files and environments name them): add keys, rename none.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from tributary.api.settings.environment import read_environment
from tributary.api.settings.errors import ConfigError, describe, describe_toml_bytes, describe_toml_syntax
from tributary.capture.records.routing import KEY_FIELD
from tributary.capture.spec import CHUNK_ROWS
from tributary.user_files import is_path

__all__ = [
    "ApiSettings",
    "CaptureSettings",
    "ConsumerSettings",
    "EventStoreSettings",
    "KafkaLogSettings",
    "ConfigError",
    "LogSettings",
    "OutboxTableSettings",
    "ProjectionSettings",
    "RuleSettings",
    "RouteSettings",
    "ServiceSettings",
    "Settings",
    "SinkSettings",
    "SourceSettings",
    "load_settings",
]

DEFAULT_CONFIG = Path("tributary.toml")
_QUALIFIED_TABLE = re.compile(r"[^.\s\"*?\[\]]+\.[^.\s\"*?\[\]]+")  # schema.table, as signal_table
log = logging.getLogger(__name__)

# Durations in ms and sizes in bytes have an upper bound too: a value past it is a typo, and an
# unbounded one would overflow where it meets a timer or a 64-bit field instead of failing here.
_MAX_MS = 100 * 365 * 86_400_000  # a century: "forever" for retention
_MAX_SEGMENT_BYTES = (1 << 32) - 1  # the log's offset index holds 32-bit byte positions (Log.open refuses more)


def _valid_dsn(dsn: str) -> str:
    """A DSN libpq can parse (a URI or key=value pairs): a typo stops the config in one line
    naming the key, not a driver's traceback later. The value is never repeated (a password)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(dsn)
    except psycopg.Error:
        raise ValueError("not a valid DSN: expected postgresql://user@host:port/dbname or key=value pairs") from None
    return dsn


class _Section(BaseModel):
    # allow_inf_nan=False: `inf` or `nan` in a float key is a mistake that would only crash later.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class ServiceSettings(_Section):
    """The service's own database: event store, checkpoints, views."""

    dsn: str | None = Field(
        default=None,
        description="DSN of the service database; unset = the embedded cluster (`tributary pg up`).",
    )

    @field_validator("dsn")
    @classmethod
    def _parsable(cls, dsn: str | None) -> str | None:
        return None if dsn is None else _valid_dsn(dsn)


class KafkaLogSettings(_Section):
    """`[log.kafka]`: the Kafka cluster of `[log] backend = "kafka"` (docs/kafka.md)."""

    bootstrap_servers: str = Field(
        default="127.0.0.1:9092", description="Kafka bootstrap servers (host:port, comma-separated)."
    )
    client: dict[str, str] = Field(
        default={},
        description="Extra librdkafka client settings, security included (e.g. `security.protocol`, "
        "`sasl.password`; `config show` masks their values).",
    )
    partitions: int = Field(
        default=4,
        ge=1,
        le=100_000,
        description="Partitions of the topics capture creates for a source without `partitions` of its own.",
    )
    replication_factor: int = Field(
        default=3, ge=1, le=32, description="Replication factor of the topics capture creates."
    )
    create_topics: bool = Field(
        default=True,
        description="Create missing topics (CDC topics compacted, others deleted by retention); false = use "
        "topics made by someone else, and fail with one line naming a missing one.",
    )
    transactional_id: str = Field(
        default="tributary-capture",
        min_length=1,
        description="Prefix of the capture producers' `transactional.id`s: one producer per source, "
        "`<prefix>-<source>` (a new capture of a source fences the old one).",
    )
    commit_timeout_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="How long capture keeps retrying a commit the cluster cannot take (brokers down or "
        "restarting, a leader moving) before it stops with one line; its records are never lost or doubled.",
    )


class LogSettings(_Section):
    backend: Literal["local", "kafka"] = Field(
        default="local",
        description="Where capture writes: `local` (the log under `root`) or `kafka` (`[log.kafka]`).",
    )
    root: Path = Field(default=Path(".tributary/log"), description="Directory of the log.")
    partitions: int = Field(default=4, ge=1, le=1024, description="Default partitions per topic.")
    segment_bytes: int = Field(default=134_217_728, ge=4096, le=_MAX_SEGMENT_BYTES, description="Segment roll size.")
    linger_ms: int = Field(default=5, ge=0, le=60_000, description="Group-commit linger (like linger.ms).")
    batch_records: int = Field(
        default=10_000, ge=1, le=1_000_000, description="Commit at most this many records at once."
    )
    delete_retention_ms: int = Field(
        default=86_400_000,
        ge=0,
        le=_MAX_MS,
        description="Compaction drops a tombstone this long after no older value of its key is left (a reader "
        "reaching it within this time sees it).",
    )
    cleaner_interval_s: float = Field(
        default=15.0,
        ge=0,
        le=86_400,
        description="How often capture looks for partitions to compact and segments to retire (0 = no "
        "background cleaner).",
    )
    min_cleanable_dirty_ratio: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Compact a partition once its sealed bytes written since its last compaction reach this "
        "share of its sealed bytes.",
    )
    retention_ms: int | None = Field(
        default=604_800_000,
        ge=0,
        le=_MAX_MS,
        description="`delete` topics without their own retention: drop sealed segments older than this.",
    )
    retention_bytes: int | None = Field(
        default=None, ge=0, le=1 << 50, description="`delete` topics: keep about this many bytes per partition at most."
    )
    file_delete_delay_ms: int = Field(
        default=60_000,
        ge=0,
        le=_MAX_MS,
        description="How long a stale Parquet copy stays for readers that planned with it.",
    )
    kafka: KafkaLogSettings = KafkaLogSettings()


class RuleSettings(_Section):
    """Column and row rules for the tables a `[[sources.rules]]` entry names (capture/records/rules.py)."""

    tables: tuple[str, ...] = Field(
        min_length=1, description="schema.table globs; a table takes the first rule that names it."
    )
    exclude: tuple[str, ...] = Field(default=(), description="Columns left out of records (not key columns).")
    mask: tuple[str, ...] = Field(default=(), description="Columns whose values become mask_chars asterisks.")
    mask_chars: int = Field(default=8, ge=1, le=255, description="Length of a masked value.")
    hash: tuple[str, ...] = Field(
        default=(), description="Columns whose values become the hex SHA-256 of hash_salt + the value's text."
    )
    hash_salt: str | None = Field(
        default=None, description="Salt of `hash` (required with it); changing it changes every hash."
    )
    truncate: tuple[str, ...] = Field(
        default=(), description="Text columns cut to truncate_chars characters (not key columns)."
    )
    truncate_chars: int = Field(default=255, ge=1, le=1_000_000, description="Length of a truncated text value.")
    row_filter: str | None = Field(
        default=None,
        description='Rows captured: an expression over the row (docs/capture.md, "Column and row rules"); others are left out.',
    )

    @field_validator("tables")
    @classmethod
    def _table_globs(cls, tables: tuple[str, ...]) -> tuple[str, ...]:
        bad = [t for t in tables if t.count(".") != 1]
        if bad:
            raise ValueError(f"each entry must be schema.table (globs allowed), not {', '.join(repr(t) for t in bad)}")
        return tables

    @field_validator("row_filter")
    @classmethod
    def _parsable_filter(cls, text: str | None) -> str | None:
        from tributary.capture.records.row_filter import compile_filter

        if text is not None:
            compile_filter(text)
        return text

    @model_validator(mode="after")
    def _consistent(self) -> RuleSettings:
        if self.hash and not self.hash_salt:
            raise ValueError("hash_salt is required when hash names columns")
        named: dict[str, str] = {}
        for what in ("exclude", "mask", "hash", "truncate"):
            for column in getattr(self, what):
                if column in named:
                    raise ValueError(f"column {column!r} is in both {named[column]} and {what}")
                named[column] = what
        return self


_OUTBOX_TOPIC = re.compile(r"(?:[A-Za-z0-9._-]|\{route\})+")  # a topic name, {route} where the aggregate type goes


class OutboxTableSettings(_Section):
    """One outbox table of the source's own services (`[[sources.outbox]]`): each INSERT is an event,
    as Debezium's outbox event router (io.debezium.transforms.outbox.EventRouter) makes it."""

    table: str = Field(
        pattern=r"^[^.\s\"*?\[\]]+\.[^.\s\"*?\[\]]+$",
        description="schema.table of the outbox table; never snapshotted, its UPDATEs and DELETEs ignored.",
    )
    id_column: str = Field(default="id", description="Event id, the record's `id` header (table.field.event.id).")
    key_column: str = Field(
        default="aggregateid", description="Aggregate id, the record's key (table.field.event.key)."
    )
    type_column: str = Field(
        default="type", description="Event type, the record's `type` header (table.field.event.type)."
    )
    payload_column: str = Field(default="payload", description="The record's value (table.field.event.payload).")
    route_by_column: str = Field(
        default="aggregatetype", description="Aggregate type, which names the topic (route.by.field)."
    )
    topic: str = Field(
        default="outbox.event.{route}",
        description="Topic of an event; {route} is its aggregate type (route.topic.replacement).",
    )
    header_columns: tuple[str, ...] = Field(
        default=(),
        description="Columns copied into the record's headers (table.fields.additional.placement).",
    )

    @field_validator("topic")
    @classmethod
    def _topic(cls, topic: str) -> str:
        if not _OUTBOX_TOPIC.fullmatch(topic):
            raise ValueError(
                "must be a topic name of letters, digits, '.', '_', '-', with {route} for the aggregate type"
            )
        return topic


_ROUTE_TOPIC = re.compile(r"(?:[A-Za-z0-9._-]|\{source\}|\{schema\}|\{table\}|\\[1-9])+")


class RouteSettings(_Section):
    """One `[[sources.routes]]` entry: the tables it takes and the topic they share, as Debezium's
    topic router (io.debezium.transforms.ByLogicalTableRouter) routes them."""

    tables: str | None = Field(
        default=None,
        pattern=r"^[^.\s]+\.[^.\s]+$",
        description="schema.table glob of the tables routed (e.g. public.shard_*); or give regex.",
    )
    regex: str | None = Field(
        default=None, description="Regex over schema.table of the tables routed, whole name (topic.regex)."
    )
    topic: str = Field(
        description="Their topic; {source}, {schema}, {table} and a regex's groups \\1… are filled in "
        "(topic.replacement)."
    )

    @field_validator("regex")
    @classmethod
    def _compiles(cls, regex: str | None) -> str | None:
        if regex is not None:
            try:
                re.compile(regex)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return regex

    @field_validator("topic")
    @classmethod
    def _topic(cls, topic: str, info: ValidationInfo) -> str:
        if (info.data.get("tables") is None) == (info.data.get("regex") is None):
            raise ValueError("give exactly one of tables (a glob) and regex")
        if not _ROUTE_TOPIC.fullmatch(topic):
            raise ValueError(
                "must be a topic name of letters, digits, '.', '_', '-', with {source}, {schema}, {table} or \\1…"
            )
        return topic


class SourceSettings(_Section):
    """One captured database; `name` is the topic prefix."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Topic prefix.")
    dsn: str = Field(description="DSN of the captured database (a role that may replicate).")
    slot: str | None = Field(default=None, description="Replication slot; default tributary_<name>.")
    include: tuple[str, ...] = Field(default=("public.*",), description="schema.table globs.")
    exclude: tuple[str, ...] = Field(default=(), description="schema.table globs to leave out.")
    snapshot: Literal["initial", "initial_only", "no_data", "always", "when_needed", "never"] = Field(
        default="initial",
        description="When to snapshot, as Debezium's snapshot.mode: initial (no position yet), initial_only "
        "(then stop), no_data (schema records only, stream from now), always (every start), when_needed "
        "(also when the slot lost WAL), never (stream from the slot's start).",
    )
    partitions: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Partitions of the topics this source creates (default: `[log] partitions`, on Kafka "
        "`[log.kafka] partitions`).",
    )
    signal_table: str | None = Field(
        default=None,
        pattern=r"^[^.\s\"*?\[\]]+\.[^.\s\"*?\[\]]+$",
        description="schema.table of a signal table (id, type, data) in the source: an INSERT of type 'execute-snapshot' re-snapshots tables.",
    )
    snapshot_method: Literal["consistent", "chunked"] = Field(
        default="consistent",
        description="consistent: one transaction at the slot's start; chunked: key chunks beside streaming.",
    )
    envelope: Literal["tributary", "debezium"] = Field(
        default="tributary",
        description="tributary: the records of docs/envelope.md; debezium: records as Debezium's PostgreSQL "
        'connector writes them under the configuration in docs/envelope.md ("A Debezium consumer"), schema included.',
    )
    snapshot_chunk_rows: int = Field(
        default=CHUNK_ROWS, ge=100, le=10_000_000, description="Rows per chunk of a chunked snapshot."
    )
    partitioned_tables: Literal["root", "leaves"] = Field(
        default="root",
        description="root: a partitioned table's changes go to the root table's topic (as Debezium's "
        "publish.via.partition.root); leaves: each leaf partition is a table of its own.",
    )
    resnapshot_on_rewrite: bool = Field(
        default=False,
        description="After a schema change that rewrote a table's rows (ALTER COLUMN TYPE, ADD COLUMN DEFAULT, …), "
        "re-snapshot it (chunked) so its topic equals the table again.",
    )
    allow_without_key: tuple[str, ...] = Field(
        default=(),
        description="schema.table of tables without a key whose lost UPDATEs and DELETEs you accept "
        "(`init` refuses them otherwise).",
    )
    rules: tuple[RuleSettings, ...] = Field(
        default=(), description="Column and row rules per table: [[sources.rules]] entries (below)."
    )
    outbox: tuple[OutboxTableSettings, ...] = Field(
        default=(), description="Outbox tables of your services, one `[[sources.outbox]]` table each."
    )
    transaction_metadata: bool = Field(
        default=False,
        description="BEGIN and END records on `<name>.transactions` and a `transaction` block (id, total_order, "
        "data_collection_order) in every streamed change, as Debezium's provide.transaction.metadata.",
    )
    heartbeat_interval_ms: int = Field(
        default=0,
        ge=0,
        le=_MAX_MS,
        description="A `<name>.heartbeat` record (ts_ms, lsn) at this interval even when the database is idle, "
        "as Debezium's heartbeat.interval.ms; 0: none.",
    )
    notification_channels: tuple[Literal["sink", "log"], ...] = Field(
        default=(),
        description='Snapshot notifications (started, table scan completed, completed, aborted): "sink" as records '
        'of `<name>.notifications`, "log" as log lines, as Debezium\'s notification.enabled.channels.',
    )

    routes: tuple[RouteSettings, ...] = Field(
        default=(),
        description="Topic routes, one `[[sources.routes]]` table each: tables sharing one topic (the first "
        "route that takes a table wins).",
    )
    key_field: str = Field(
        default=KEY_FIELD,
        pattern=r"^\S+$",
        description="Field added to the keys of routed tables, naming the table's own topic (key.field.name).",
    )
    key_enforce_uniqueness: bool = Field(
        default=True,
        description="Add key_field to routed tables' keys; false only when their keys are unique across the "
        "tables of a topic (key.enforce.uniqueness).",
    )

    @field_validator("dsn")
    @classmethod
    def _parsable(cls, dsn: str) -> str:
        return _valid_dsn(dsn)

    @field_validator("routes")
    @classmethod
    def _routes_envelope(cls, routes: tuple[RouteSettings, ...], info: ValidationInfo) -> tuple[RouteSettings, ...]:
        if routes and info.data.get("envelope") == "debezium":
            raise ValueError('routes are not supported with envelope = "debezium" yet')
        return routes

    @field_validator("allow_without_key")
    @classmethod
    def _qualified_tables(cls, tables: tuple[str, ...]) -> tuple[str, ...]:
        bad = [t for t in tables if not _QUALIFIED_TABLE.fullmatch(t)]
        if bad:
            raise ValueError(f"each entry must be schema.table, not {', '.join(repr(t) for t in bad)}")
        return tables

    @field_validator("outbox")
    @classmethod
    def _unique_outbox(
        cls, outbox: tuple[OutboxTableSettings, ...], info: ValidationInfo
    ) -> tuple[OutboxTableSettings, ...]:
        tables = [t.table for t in outbox]
        if twice := sorted({t for t in tables if tables.count(t) > 1}):
            raise ValueError(f"table {twice[0]} is named by two [[sources.outbox]] entries")
        if (signal := info.data.get("signal_table")) in tables:
            raise ValueError(f"table {signal} is the signal_table: it cannot be an outbox table too")
        return outbox

    @property
    def slot_name(self) -> str:
        return self.slot or f"tributary_{self.name}"


class CaptureSettings(_Section):
    status_interval_s: float = Field(default=5.0, gt=0, le=60, description="Standby status period.")
    capture_eventstore: bool = Field(
        default=True, description="Also capture eventstore.events into events.<stream_type>."
    )
    max_backoff_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Ceiling of each source's retry backoff: a failed source retries after 0.5 s, doubling up to this (a misconfigured one waits this long).",
    )
    progress_interval_s: float = Field(
        default=30.0,
        gt=0,
        le=86_400,
        description="How often `capture`, when not on a terminal, logs a progress line per source (state, "
        "changes, changes/s, the snapshot under way).",
    )


class ProjectionSettings(_Section):
    spark_master: str = Field(default="local[*]", description="Spark master URL.")
    spark_conf: dict[str, str] = Field(
        default={},
        description="Any Spark setting, applied when the session is built and winning over the defaults (e.g. "
        "spark.driver.host for executors on other hosts; `config show` masks secrets).",
    )
    shuffle_partitions: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Partitions of a fold's shuffle (default: spark_conf's spark.sql.shuffle.partitions, else the "
        "task slots of the registered executors).",
    )
    executor_dsn: str | None = Field(
        default=None,
        description="The service database as Spark's executors reach it (they COPY a fold's output into staging "
        "tables; default: [service] dsn).",
    )
    executor_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=86_400,
        description="How long a run on a cluster waits for an executor to run its first task before it stops.",
    )
    state_cache_units: int = Field(
        default=100_000,
        ge=0,
        le=100_000_000,
        description="`project run --continuous` keeps this many units' fold states in memory between its passes "
        "(least recently used go first; 0 = off): a pass loads only the states it does not hold.",
    )
    modules: tuple[str, ...] = Field(
        default=(), description="Your projection files (relative to this file) or modules."
    )
    schema_: str = Field(default="views", alias="schema", description="Schema of derived tables.")
    mirror: tuple[str, ...] = Field(default=(), description="Captured topics to mirror as tables.")
    kafka_reader: Literal["python", "spark"] = Field(
        default="python",
        description='On `[log] backend = "kafka"`, what reads the records: `python` (confluent-kafka consumers in '
        "Spark's Python workers) or `spark` (Spark's own Kafka source, fetched by `make setup`).",
    )
    driver_read_records: int = Field(
        default=100_000,
        ge=0,
        le=10_000_000,
        description="An incremental DataFrame projection's run of at most this many new records reads them in the "
        "driver instead of in Spark tasks (0 = always in tasks; the local log only).",
    )


class EventStoreSettings(_Section):
    modules: tuple[str, ...] = Field(
        default=(),
        description="Your aggregate files (relative to this file) or modules; none = the API serves no commands.",
    )
    max_retries: int = Field(default=3, ge=0, le=100, description="Retries of a command on a version conflict.")
    snapshot_every: int = Field(
        default=100, ge=0, le=1_000_000, description="Snapshot an aggregate every N events (0 = never)."
    )
    scavenge_interval_s: float = Field(
        default=0,
        ge=0,
        le=604_800,
        description="`tributary serve` removes what stream metadata and deletes hide every N seconds (0 = off).",
    )
    removed_positions_keep_s: float = Field(
        default=604_800,
        gt=0,
        le=31_622_400,
        description="A scavenge keeps the `$all` positions of removed events this long (a reader holding one can "
        "still continue after it), then forgets them: such a reader gets 404 `unknown_position`.",
    )


class ApiKey(_Section):
    key: str
    scopes: tuple[Literal["read", "write", "admin"], ...] = ("read",)

    @field_validator("key")
    @classmethod
    def _usable_key(cls, key: str) -> str:
        # An empty key would count as "keys configured" (lifting the loopback-only bind) while
        # matching no request; spaces or non-ASCII can never arrive in an Authorization header.
        if not key:
            raise ValueError("must not be empty")
        if not all("!" <= c <= "~" for c in key):
            raise ValueError("must be printable ASCII without spaces (it is sent in an HTTP header)")
        return key


class ApiSettings(_Section):
    host: str = Field(default="127.0.0.1", description="Bind address.")
    port: int = Field(default=8000, ge=0, le=65535, description="Bind port.")
    keys: tuple[ApiKey, ...] = Field(default=(), description="API keys with scopes.")
    max_body_bytes: int = Field(default=1_048_576, ge=1024, le=1 << 26, description="Larger bodies get 413.")
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Server processes sharing the port (1 suits a few cores shared with PostgreSQL).",
    )
    http: Literal["h11", "httptools"] = Field(
        default="httptools",
        description="HTTP/1.1 parser, each under the same bounds per connection (head size, pipelined requests "
        "held back): httptools (C, less CPU per request) or h11 (pure Python).",
    )
    max_header_bytes: int = Field(
        default=16_384,
        ge=1024,
        le=1_048_576,
        description="Request line plus headers larger than this are refused (431, or 400 while they still "
        "arrive) and the connection is closed.",
    )
    request_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="A connection must send a request's head within this many seconds of connecting or of "
        "its previous response (else 408 and closed), and read a response within it (else closed).",
    )
    max_connections: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="Open connections per server process, kept below the open-files limit; at the limit a "
        "new connection closes the one waiting longest for a request.",
    )
    statement_timeout_ms: int = Field(
        default=5000,
        ge=0,
        le=86_400_000,
        description="PostgreSQL statement_timeout of view queries (0 = none); a query that hits it gets 503.",
    )
    prepared_max: int = Field(
        default=32,
        ge=0,
        le=10_000,
        description="Prepared query shapes kept per view connection (psycopg prepared_max; 0 = never prepare); "
        "bounds the memory of each database backend serving views.",
    )
    status_refresh_s: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="How often /readyz and /metrics refresh their figures in the background (each call "
        "answers from the last refresh).",
    )
    subscription_poll_s: float = Field(
        default=0.1,
        ge=0.01,
        le=60,
        description="While anyone is subscribed (`GET /all/subscribe`), how often the server asks the database "
        "whether there are new events (one index probe per server process).",
    )
    subscription_page: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="Events a subscriber reads (and holds) at most at a time.",
    )
    subscription_keepalive_s: float = Field(
        default=15.0,
        ge=1,
        le=3600,
        description="After this many seconds without an event a subscription sends a comment line, so proxies "
        "keep an idle connection open.",
    )


class SinkSettings(_Section):
    """One sink: a consumer group that delivers `topics` elsewhere (`tributary sinks run`)."""

    type: Literal["http"] = Field(description="Sink kind: `http` POSTs batches (JSON arrays of records) to `url`.")
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$", description="Sink name (status, dead letters).")
    url: str = Field(pattern=r"^https?://", description="Where batches are POSTed.")
    topics: tuple[str, ...] = Field(min_length=1, description="Topics to deliver.")
    group: str | None = Field(default=None, description="Consumer group; default sink-<name>.")
    headers: dict[str, str] = Field(
        default={}, description="Extra request headers (e.g. Authorization; `config show` masks their values)."
    )
    auto_offset_reset: Literal["earliest", "latest", "error"] = Field(
        default="earliest", description="Where a new group starts (or one whose offset fell behind retention)."
    )
    max_batch_records: int = Field(default=500, ge=1, le=100_000, description="Records per request at most.")
    max_batch_bytes: int = Field(default=1_048_576, ge=1024, le=1 << 28, description="Bytes per request at most.")
    linger_ms: int = Field(default=100, ge=0, le=60_000, description="Wait this long for a batch to fill.")
    max_attempts: int = Field(
        default=10, ge=1, le=1_000_000, description="Failed attempts of a batch before its records are dead letters."
    )
    initial_backoff_ms: int = Field(default=200, ge=1, le=3_600_000, description="First retry wait (doubles).")
    max_backoff_ms: int = Field(default=30_000, ge=1, le=3_600_000, description="Ceiling of the retry wait.")
    request_timeout_s: float = Field(default=10.0, gt=0, le=3600, description="Timeout of one request.")

    @property
    def group_name(self) -> str:
        return self.group or f"sink-{self.name}"


class ConsumerSettings(_Section):
    """Consumer groups served over HTTP (docs/consumers.md)."""

    session_timeout_ms: int = Field(
        default=10_000,
        ge=100,
        le=3_600_000,
        description="A member that sends no heartbeat (or pull, or stream) for this long leaves its group; a "
        "member may ask for its own when it joins.",
    )
    auto_offset_reset: Literal["earliest", "latest", "error"] = Field(
        default="latest",
        description="Where a member starts on a partition without a committed offset, or whose offset fell "
        "behind retention, unless it asks otherwise when it joins (error = refuse with 410).",
    )
    poll_interval_ms: int = Field(
        default=20,
        ge=1,
        le=1000,
        description="How often waiting pulls and streams re-read the log's manifest (on Kafka: ask the cluster for "
        "the ends, at least every 50 ms) while someone waits, where inotify does not report the manifest's "
        "replacement (with inotify: at once, and once a second in any case).",
    )
    stream_batch_records: int = Field(
        default=500,
        ge=1,
        le=100_000,
        description="Records a stream reads ahead of its client at most (a slow client holds only its own stream).",
    )
    sweep_interval_ms: int = Field(
        default=1000,
        ge=100,
        le=60_000,
        description="How often the server moves the partitions of members past their session timeout.",
    )
    max_retries: int = Field(
        default=5,
        ge=0,
        le=1000,
        description="Nacks of one record before it is parked, unless a member names its own when it joins.",
    )
    retry_backoff_ms: int = Field(
        default=1000,
        ge=1,
        le=60_000,
        description="Wait before a nacked record is delivered again, doubling per attempt up to 60 s, unless a "
        "member names its own when it joins.",
    )


class Settings(BaseModel):
    """Every key; `load_settings` fills it from the file and the `TRIBUTARY_*` environment
    (`Settings()` alone is the built-in defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    service: ServiceSettings = ServiceSettings()
    log: LogSettings = LogSettings()
    sources: tuple[SourceSettings, ...] = ()
    capture: CaptureSettings = CaptureSettings()
    eventstore: EventStoreSettings = EventStoreSettings()
    projections: ProjectionSettings = ProjectionSettings()
    api: ApiSettings = ApiSettings()
    consumers: ConsumerSettings = ConsumerSettings()
    sinks: tuple[SinkSettings, ...] = ()
    pg_data_dir: Path = Field(default=Path(".tributary/pg"), description="Data directory of the embedded cluster.")

    @field_validator("sources")
    @classmethod
    def _unique_sources(cls, sources: tuple[SourceSettings, ...]) -> tuple[SourceSettings, ...]:
        names = [s.name for s in sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate source name(s): {', '.join(dupes)}")
        return sources

    @field_validator("sinks")
    @classmethod
    def _unique_sinks(cls, sinks: tuple[SinkSettings, ...]) -> tuple[SinkSettings, ...]:
        names = [s.name for s in sinks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate sink name(s): {', '.join(dupes)}")
        return sinks


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark (some Windows editors) is not an error
    except UnicodeDecodeError as exc:
        raise ConfigError(describe_toml_bytes(path, raw, exc)) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(describe_toml_syntax(path, text, exc)) from None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, tables merged key by key, anything else replaced whole."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


_SECTIONS_WITH_FILES = ("eventstore", "projections")  # their `modules` may name files
_warned: set[tuple[str, str]] = set()  # (config file, module): the compatibility warning, once per process


def _absolute(ref: str, base: Path | None, config: Path, section: str) -> str:
    """A file reference made absolute: relative to the config file's folder (`base`), or, with no
    base (the environment), to the working directory. For compatibility, a path found only
    relative to the working directory still loads, with one warning."""
    if not is_path(ref) or Path(ref).is_absolute():
        return ref
    if base is None:
        return str(Path(ref).resolve())
    beside = (base / ref).resolve()
    if not beside.exists() and Path(ref).exists():
        if (str(config), ref) not in _warned:
            _warned.add((str(config), ref))
            log.warning(
                "%s: [%s] modules: %r is found relative to the working directory, not to the config file "
                "(loaded anyway): write it as %r",
                config,
                section,
                ref,
                os.path.relpath(Path(ref).resolve(), base.resolve()),
            )
        return str(Path(ref).resolve())
    return str(beside)


def _files_absolute(data: dict[str, Any], base: Path | None, config: Path) -> dict[str, Any]:
    """`data` with the file paths (`x/y.py`) of `[eventstore] modules` and `[projections] modules`
    absolute, so every process (a rebuild's child, a Spark worker) loads the same file."""
    out = dict(data)
    for name in _SECTIONS_WITH_FILES:
        section = data.get(name)
        if isinstance(section, dict) and isinstance(section.get("modules"), list):
            refs = [_absolute(m, base, config, name) if isinstance(m, str) else m for m in section["modules"]]
            out[name] = {**section, "modules": refs}
    return out


def load_settings(path: Path | None = None) -> Settings:
    """Load and validate settings; `path=None` means ./tributary.toml if present, else defaults.

    The environment (`TRIBUTARY_<SECTION>__<KEY>`) wins over the file, so a deployment overrides a
    shared file. Every problem found is reported at once (ConfigError.problems), each naming its key."""
    explicit = path is not None
    path = path if path is not None else DEFAULT_CONFIG
    data: dict[str, Any] = {}
    if path.exists():
        data = _read_toml(path)
    elif explicit:
        raise ConfigError(f"config file not found: {path}")
    env = read_environment(Settings, os.environ)
    problems = list(env.problems)
    merged = _merge(_files_absolute(data, path.parent, path), _files_absolute(env.data, None, path))
    try:
        settings = Settings(**merged)
    except ValidationError as exc:
        problems.extend(describe(exc, Settings, merged, origin=str(path), provenance=env.provenance))
    if problems:
        raise ConfigError(*problems)
    return settings
