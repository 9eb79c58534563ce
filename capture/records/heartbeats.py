"""Heartbeat records (`heartbeat_interval_ms`): `<source>.heartbeat`, one record per interval even
when the database is idle, as Debezium's `heartbeat.interval.ms` (its topic is
`__debezium-heartbeat.<topic.prefix>`). Consumers and lag metrics see the source move; the
record is committed with the source's position, so an idle slot is confirmed with it. Pure."""

from __future__ import annotations

import orjson

from tributary.capture.decoding.lsn import Lsn
from tributary.capture.records.envelope import Output

__all__ = ["heartbeat_record", "heartbeat_topic"]


def heartbeat_topic(source_name: str) -> str:
    """`<source>.heartbeat`."""
    return f"{source_name}.heartbeat"


def heartbeat_record(source_name: str, lsn: Lsn, now_ms: int) -> Output:
    """Key `{"serverName": <source>}` as Debezium's; value `{ts_ms, lsn}`: the position the
    source's records reach at `now_ms` (an int, as `source.lsn`)."""
    key = orjson.dumps({"serverName": source_name})
    value = orjson.dumps({"ts_ms": now_ms, "lsn": int(lsn)})
    return Output(heartbeat_topic(source_name), key, value, timestamp_ms=now_ms)
