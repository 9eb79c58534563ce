"""The sinks' rows in the service database: dead letters and delivery status
(schema `tributary_sinks`, migration `0004_sinks`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import psycopg
from psycopg.types.json import Jsonb
from tributary_client import Record

from tributary.jsonvalue import JsonValue

__all__ = ["DeadLetterRow", "SinkError", "SinkStatus", "SinkStore"]


class SinkError(Exception):
    """Every failure of the sinks a user can act on (the CLI prints it as one line)."""


@dataclass(frozen=True)
class DeadLetterRow:
    sink: str
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: str | None
    value: JsonValue
    headers: dict[str, str]
    error: str
    attempts: int
    failed_at: datetime


@dataclass(frozen=True)
class SinkStatus:
    sink: str
    state: str
    delivered: int
    requests: int
    failed_attempts: int
    dead_letters: int
    last_error: str | None
    last_delivery_at: datetime | None
    pid: int | None
    updated_at: datetime


class SinkStore:
    """One connection (autocommit) to the service database, used by one sink's thread."""

    def __init__(self, dsn: str) -> None:
        try:
            self._conn = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
        except psycopg.OperationalError as exc:  # libpq's message names host and port, never the password
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SinkError(f"cannot reach the service database: {reason}") from None

    def close(self) -> None:
        self._conn.close()

    def dead_letter(self, sink: str, records: Sequence[Record], error: str, attempts: int) -> int:
        """Store `records` as dead letters of `sink` (idempotent per record); returns how many were new."""
        if not records:
            return 0
        rows = [
            (
                sink,
                r.topic,
                r.partition,
                r.offset,
                r.timestamp_ms,
                r.key,
                None if r.value is None else Jsonb(r.value),
                Jsonb(dict(r.headers)),
                error[:2000],
                attempts,
            )
            for r in records
        ]
        with self._conn.transaction(), self._conn.cursor() as cur:
            cur.executemany(
                """
                INSERT INTO tributary_sinks.dead_letters
                    (sink, topic, partition, "offset", timestamp_ms, key, value, headers, error, attempts)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
                ON CONFLICT DO NOTHING
                """,
                rows,
                returning=False,
            )
            new = cur.rowcount
        return max(new, 0)

    def dead_letters(self, sink: str, *, limit: int = 100) -> list[DeadLetterRow]:
        rows = self._read(
            """
            SELECT sink, topic, partition, "offset", timestamp_ms, key, value, headers, error, attempts, failed_at
            FROM tributary_sinks.dead_letters WHERE sink = %s ORDER BY failed_at, topic, partition, "offset" LIMIT %s
            """,
            (sink, limit),
        )
        return [DeadLetterRow(*row) for row in rows]

    def report(
        self,
        sink: str,
        *,
        state: str,
        delivered: int = 0,
        requests: int = 0,
        failed_attempts: int = 0,
        dead_letters: int = 0,
        last_error: str | None = None,
        delivered_now: bool = False,
    ) -> None:
        """Add the increments to `sink`'s status row and set its state (and its last error, if given)."""
        self._conn.execute(
            """
            INSERT INTO tributary_sinks.status AS s
                (sink, state, delivered, requests, failed_attempts, dead_letters, last_error, last_delivery_at, pid)
            VALUES (%(sink)s, %(state)s, %(d)s, %(r)s, %(f)s, %(x)s, %(e)s, CASE WHEN %(now)s THEN now() END, %(pid)s)
            ON CONFLICT (sink) DO UPDATE SET
                state = excluded.state,
                delivered = s.delivered + excluded.delivered,
                requests = s.requests + excluded.requests,
                failed_attempts = s.failed_attempts + excluded.failed_attempts,
                dead_letters = s.dead_letters + excluded.dead_letters,
                last_error = coalesce(excluded.last_error, s.last_error),
                last_delivery_at = coalesce(excluded.last_delivery_at, s.last_delivery_at),
                pid = excluded.pid,
                updated_at = now()
            """,
            {
                "sink": sink,
                "state": state,
                "d": delivered,
                "r": requests,
                "f": failed_attempts,
                "x": dead_letters,
                "e": None if last_error is None else last_error[:2000],
                "now": delivered_now,
                "pid": os.getpid(),
            },
        )

    def statuses(self) -> list[SinkStatus]:
        rows = self._read(
            """
            SELECT sink, state, delivered, requests, failed_attempts, dead_letters, last_error, last_delivery_at,
                   pid, updated_at
            FROM tributary_sinks.status ORDER BY sink
            """
        )
        return [SinkStatus(*row) for row in rows]

    def _read(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._conn.execute(query, params).fetchall()
        except psycopg.errors.UndefinedTable:
            raise SinkError(
                "the service database has no sink tables yet (or an older schema): run `tributary init`"
            ) from None


def encode(record: Record) -> bytes:
    """A record as the sink posts it (the pull API's shape)."""
    return orjson.dumps(
        {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp_ms": record.timestamp_ms,
            "key": record.key,
            "value": record.value,
            "headers": dict(record.headers),
        }
    )
