"""Building ProjectionRecords for pure tests."""

from __future__ import annotations

from typing import Any

from tributary.projections.records import ProjectionRecord, ms_to_iso


def event(
    topic: str,
    partition: int,
    offset: int,
    stream: str,
    kind: str,
    at_ms: int,
    version: int = 1,
    **data: Any,
) -> ProjectionRecord:
    value = {
        "id": f"{stream}-{topic}-{offset}",
        "stream": stream,
        "version": version,
        "type": kind,
        "schema_version": 1,
        "data": data,
        "metadata": {},
        "occurred_at": ms_to_iso(at_ms),
        "recorded_at": ms_to_iso(at_ms),
    }
    return ProjectionRecord(topic, partition, offset, at_ms, stream, value, None, at_ms)


def change(
    topic: str,
    offset: int,
    key: dict[str, Any],
    op: str,
    after: dict[str, Any] | None,
    ts: int = 0,
    partition: int = 0,
) -> ProjectionRecord:
    value = (
        None
        if op == "tombstone"
        else {
            "before": None,
            "after": after,
            "op": op,
            "source": {"ts_ms": ts, "lsn": offset},
            "ts_ms": ts,
        }
    )
    return ProjectionRecord(topic, partition, offset, ts, key, value, None, ts)


def log_of(records: list[ProjectionRecord]) -> dict[tuple[str, int], list[ProjectionRecord]]:
    """Records by topic-partition, in the order given (offset order per partition)."""
    out: dict[tuple[str, int], list[ProjectionRecord]] = {}
    for r in records:
        out.setdefault((r.topic, r.partition), []).append(r)
    return out
