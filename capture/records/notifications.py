"""Snapshot notifications (`notification_channels`): a snapshot's start, each table scanned, its
end or abort, as records on `<source>.notifications` ("sink") and as log lines ("log"), as
Debezium's notification channels (`notification.enabled.channels = sink,log`).

A record is staged where the event happens, so it is committed with what it reports (a consistent
snapshot's records, a chunk, the snapshot context); key `{"source": <name>}`, one partition, in
order. Value as Debezium's: `{id, aggregate_type, type, additional_data, timestamp}`."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence

import orjson

from tributary.capture.records.envelope import Output
from tributary.capture.records.staging import Staging

__all__ = ["INCREMENTAL", "INITIAL", "Notifier", "notification_record", "notifications_topic"]

INITIAL = "Initial Snapshot"  # the consistent snapshot (Debezium's aggregate type)
INCREMENTAL = "Incremental Snapshot"  # the chunked snapshot and chunked re-snapshots

log = logging.getLogger(__name__)


def notifications_topic(source_name: str) -> str:
    """`<source>.notifications` (Debezium: `notification.sink.topic.name`)."""
    return f"{source_name}.notifications"


def notification_record(
    source_name: str, aggregate_type: str, kind: str, data: dict[str, str], now_ms: int, id_: str
) -> Output:
    """One notification as a record of `<source>.notifications`."""
    value = {
        "id": id_,
        "aggregate_type": aggregate_type,
        "type": kind,
        "additional_data": {"connector_name": source_name, **data},
        "timestamp": now_ms,
    }
    key = orjson.dumps({"source": source_name})
    return Output(notifications_topic(source_name), key, orjson.dumps(value), timestamp_ms=now_ms)


class Notifier:
    """One source's notifications, sent on its configured channels."""

    def __init__(self, source_name: str, channels: Sequence[str], *, clock: Callable[[], float] = time.time) -> None:
        self.source_name = source_name
        self.sink = "sink" in channels
        self.log = "log" in channels
        self.clock = clock

    def __call__(self, staging: Staging, aggregate_type: str, kind: str, data: dict[str, str] | None = None) -> None:
        """Send one notification: staged into `staging` (committed with what it reports) and logged."""
        if not (self.sink or self.log):
            return
        now_ms = int(self.clock() * 1000)
        record = notification_record(self.source_name, aggregate_type, kind, data or {}, now_ms, str(uuid.uuid4()))
        if self.sink:
            staging.stage([record], now_ms)
            staging.flush()  # appended now: the next commit point takes it with what it reports
        if self.log:
            assert record.value is not None
            log.info("source %s: notification %s", self.source_name, record.value.decode())
