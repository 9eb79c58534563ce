"""Writing small logs of bank events for the projection tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import psycopg
from psycopg import sql

from tributary.log.local import Log, TopicConfig, canonical_json
from tributary.projections.records import ms_to_iso

DAY = 86_400_000


def event_value(stream: str, version: int, kind: str, at_ms: int, **data: Any) -> bytes:
    return orjson.dumps(
        {
            "id": f"{stream}-{version}-{kind}-{at_ms}",
            "stream": stream,
            "version": version,
            "type": kind,
            "schema_version": 1,
            "data": data,
            "metadata": {},
            "occurred_at": ms_to_iso(at_ms),
            "recorded_at": ms_to_iso(at_ms),
        }
    )


class LogWriter:
    """The test's log writer: appends events keyed by stream id and commits."""

    def __init__(self, root: Path) -> None:
        self.log = Log.open(root, writer=True, segment_bytes=4096)

    def topic(self, name: str, partitions: int = 2) -> None:
        if name not in self.log.topics():
            self.log.create_topic(name, TopicConfig(partitions=partitions))

    def append(self, topic: str, stream: str, version: int, kind: str, at_ms: int, **data: Any) -> None:
        key = canonical_json(stream)
        part = self.log.partition_for(topic, key)
        self.log.append(topic, part, [(key, event_value(stream, version, kind, at_ms, **data), at_ms, None)])

    def commit(self) -> None:
        self.log.commit()

    def close(self) -> None:
        self.log.close()


def dump(dsn: str, relation: str) -> list[str]:
    """Every row of a table or view as text, sorted: equal lists = byte-identical tables."""
    schema, name = relation.split(".")
    q = sql.SQL("SELECT t::text FROM {} t ORDER BY 1").format(sql.Identifier(schema, name))
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute(q).fetchall()]


def run_sql(dsn: str, *statements: str) -> None:
    """Run statements on the source database, each in its own transaction."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt)


def capture_until_idle(config: Path) -> None:
    """One `tributary capture` that stops once the source is idle: the log has every change."""
    from tests.integration.capture.helpers import cli

    res = cli("capture", "--config", str(config), "--until-idle", "1.5")
    assert res.returncode == 0, res.stderr
