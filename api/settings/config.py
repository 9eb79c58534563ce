"""Configuration: `tributary.toml` + `TRIBUTARY_<SECTION>__<KEY>` environment overrides.

Frozen at the edge (the CLI loads it once) and passed down as plain values; nothing deeper reads
the environment. Key names are a contract (users' files and environments name them): add keys, rename none.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

__all__ = [
    "ApiSettings",
    "CaptureSettings",
    "EventStoreSettings",
    "ConfigError",
    "LogSettings",
    "ProjectionSettings",
    "ServiceSettings",
    "Settings",
    "SourceSettings",
    "load_settings",
]

DEFAULT_CONFIG = Path("tributary.toml")


class ConfigError(Exception):
    """A configuration problem, phrased for the user (names the key and the file)."""


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServiceSettings(_Section):
    """The service's own database: event store, checkpoints, views."""

    dsn: str | None = Field(
        default=None,
        description="DSN of the service database; unset = the embedded cluster (`tributary pg up`).",
    )


class LogSettings(_Section):
    root: Path = Field(default=Path(".tributary/log"), description="Directory of the log.")
    partitions: int = Field(default=4, ge=1, le=1024, description="Default partitions per topic.")
    segment_bytes: int = Field(default=134_217_728, ge=4096, description="Segment roll size.")
    linger_ms: int = Field(default=5, ge=0, description="Group-commit linger (like linger.ms).")
    batch_records: int = Field(default=10_000, ge=1, description="Commit at most this many records at once.")
    delete_retention_ms: int = Field(
        default=86_400_000,
        ge=0,
        description="Compaction drops a tombstone this long after no older value of its key is left (a reader "
        "reaching it within this time sees it).",
    )
    cleaner_interval_s: float = Field(
        default=15.0,
        ge=0,
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
        description="`delete` topics without their own retention: drop sealed segments older than this.",
    )
    retention_bytes: int | None = Field(
        default=None, ge=0, description="`delete` topics: keep about this many bytes per partition at most."
    )
    file_delete_delay_ms: int = Field(
        default=60_000,
        ge=0,
        description="How long a stale Parquet copy stays for readers that planned with it.",
    )


class SourceSettings(_Section):
    """One captured database; `name` is the topic prefix."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Topic prefix.")
    dsn: str = Field(description="DSN of the captured database (a role that may replicate).")
    slot: str | None = Field(default=None, description="Replication slot; default tributary_<name>.")
    include: tuple[str, ...] = Field(default=("public.*",), description="schema.table globs.")
    exclude: tuple[str, ...] = Field(default=(), description="schema.table globs to leave out.")
    snapshot: Literal["initial", "never", "when_needed"] = Field(
        default="initial", description="Initial snapshot policy."
    )
    partitions: int | None = Field(default=None, ge=1, le=1024, description="Partitions per topic.")

    @property
    def slot_name(self) -> str:
        return self.slot or f"tributary_{self.name}"


class CaptureSettings(_Section):
    status_interval_s: float = Field(default=5.0, gt=0, le=60, description="Standby status period.")
    capture_eventstore: bool = Field(
        default=True, description="Also capture eventstore.events into events.<stream_type>."
    )
    max_backoff_s: float = Field(default=30.0, gt=0, description="Reconnect backoff ceiling.")


class ProjectionSettings(_Section):
    spark_master: str = Field(default="local[*]", description="Spark master URL.")
    modules: tuple[str, ...] = Field(default=(), description="Projection files or modules.")
    schema_: str = Field(default="views", alias="schema", description="Schema of derived tables.")
    mirror: tuple[str, ...] = Field(default=(), description="Captured topics to mirror as tables.")


class EventStoreSettings(_Section):
    max_retries: int = Field(default=3, ge=0, le=100, description="Retries of a command on a version conflict.")
    snapshot_every: int = Field(default=100, ge=0, description="Snapshot an aggregate every N events (0 = never).")
    overdraft_fee: str = Field(
        default="5.00", pattern=r"^\d+(\.\d{1,2})?$", description="Bank example: fee per overdraft."
    )


class ApiKey(_Section):
    key: str
    scopes: tuple[Literal["read", "write", "admin"], ...] = ("read",)


class ApiSettings(_Section):
    host: str = Field(default="127.0.0.1", description="Bind address.")
    port: int = Field(default=8000, ge=0, le=65535, description="Bind port.")
    keys: tuple[ApiKey, ...] = Field(default=(), description="API keys with scopes.")
    max_body_bytes: int = Field(default=1_048_576, ge=1024, description="Larger bodies get 413.")
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Server processes sharing the port (1 suits a few cores shared with PostgreSQL).",
    )
    http: Literal["h11", "httptools"] = Field(
        default="h11",
        description="HTTP/1.1 parser. h11 bounds each connection (head size, no queue of pipelined requests); "
        "httptools costs less CPU per request but queues pipelined requests and takes heads of any size: "
        "only behind a proxy that bounds both.",
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
        description="Open connections per server process, kept below the open-files limit; at the limit a "
        "new connection closes the one waiting longest for a request.",
    )
    statement_timeout_ms: int = Field(
        default=5000,
        ge=0,
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


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TRIBUTARY_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
        populate_by_name=True,
    )

    service: ServiceSettings = ServiceSettings()
    log: LogSettings = LogSettings()
    sources: tuple[SourceSettings, ...] = ()
    capture: CaptureSettings = CaptureSettings()
    eventstore: EventStoreSettings = EventStoreSettings()
    projections: ProjectionSettings = ProjectionSettings()
    api: ApiSettings = ApiSettings()
    pg_data_dir: Path = Field(default=Path(".tributary/pg"), description="Data directory of the embedded cluster.")

    @field_validator("sources")
    @classmethod
    def _unique_sources(cls, sources: tuple[SourceSettings, ...]) -> tuple[SourceSettings, ...]:
        names = [s.name for s in sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate source name(s): {', '.join(dupes)}")
        return sources

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment wins over the file (passed as init kwargs): a deployment overrides a shared file.
        return (env_settings, init_settings)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config error in {path}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None


def _describe(exc: ValidationError, origin: str) -> str:
    first = exc.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "(root)"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"config error in {origin}: {key}: {first['msg']}{more}"


def load_settings(path: Path | None = None) -> Settings:
    """Load and validate settings; `path=None` means ./tributary.toml if present, else defaults."""
    explicit = path is not None
    path = path if path is not None else DEFAULT_CONFIG
    data: dict[str, Any] = {}
    if path.exists():
        data = _read_toml(path)
    elif explicit:
        raise ConfigError(f"config file not found: {path}")
    origin = str(path) if path.exists() else "built-in defaults"
    if any(k.startswith("TRIBUTARY_") for k in os.environ):
        origin += " + TRIBUTARY_* environment"
    try:
        return Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, origin)) from None
