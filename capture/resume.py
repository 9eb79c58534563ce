"""Where capture resumes after its manifest was rebuilt: the source positions it lost.

The log keeps each source's position (the LSN its committed records reach) in the manifest, as
an opaque string; when `tributary log verify --repair` rebuilds a lost manifest from the segments,
the log asks this module for them (`positions_in`), so capture continues the slot instead of
taking a new snapshot that would append everything again.

A position found here is never past what the log holds (a later one would make capture skip
transactions the log lacks): the largest of
* the `confirmed_lsn` of the source in `capture-status.json` (capture confirms an LSN only once
  the log holds everything of the source before it), and
* the largest `source.lsn` of the source's records (a change's own LSN: the transaction holding
  it is in the log, and every transaction that ended before it).
An earlier position than the lost one costs nothing: the server streams from the slot's confirmed
position anyway. A source found in neither (the outbox's records carry no LSN) has no position:
capture then decides as for a new source.

A chunked snapshot under way (capture/snapshot/chunked.py) kept its progress in the lost manifest too: the
tables the status file shows pending are read again from their first key (a chunk row read twice
is a harmless duplicate of the same row version; none is skipped), and each of them ends with the
check of its topic's keys (a delete + tombstone per key the table no longer has). Which of them a
re-snapshot had to check is lost with the manifest, so all are checked: on a topic whose keys all
are still rows it only costs a read of the keys; skipped, it would keep deleted rows forever.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from tributary.capture.decoding.lsn import Lsn
from tributary.capture.snapshot.chunked import SnapshotContext, context_key
from tributary.capture.status import read_status
from tributary.log import RebuiltLog

__all__ = ["confirmed_in_status", "positions_in"]


def _status_sources(root: Path) -> list[dict[str, object]]:
    try:
        doc = read_status(root) or {}
    except (OSError, ValueError):
        return []
    return [s for s in doc.get("sources") or [] if isinstance(s, dict)]


def confirmed_in_status(root: Path) -> dict[str, Lsn]:
    """Each source's `confirmed_lsn` in the status file: what capture last confirmed to its slot
    (a position the slot may legitimately start at, even past a manifest written by a capture
    that confirmed idle positions before committing them)."""
    found: dict[str, Lsn] = {}
    for source in _status_sources(root):
        try:
            found[str(source["name"])] = Lsn.parse(str(source["confirmed_lsn"]))
        except (KeyError, TypeError, ValueError):
            continue
    return found


def _source_lsn(value: bytes | None) -> tuple[str, int] | None:
    """(source name, lsn) of a capture envelope, None for anything else (tombstones, events)."""
    if value is None or b'"source"' not in value:
        return None
    try:
        source = orjson.loads(value).get("source")
        return str(source["name"]), int(source["lsn"])
    except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        return None


def _from_records(log: RebuiltLog) -> dict[str, Lsn]:
    """The largest `source.lsn` per source. A partition holds its source's records in the
    source's order, so its newest segment is read first; older data only if that has none."""
    found: dict[str, int] = {}
    for (topic, partition), end in log.ends().items():
        for start in dict.fromkeys((end.segment, 0)):
            seen = False
            for rec in log.read(topic, partition, start):
                hit = _source_lsn(rec.value)
                if hit is not None:
                    seen = True
                    found[hit[0]] = max(found.get(hit[0], 0), hit[1])
            if seen:
                break
    return {name: Lsn(lsn) for name, lsn in found.items()}


def _snapshots_pending(root: Path) -> dict[str, str]:
    """A chunked snapshot's context per source whose status shows tables pending: read again,
    each table's topic checked after (see the module's doc)."""
    found: dict[str, str] = {}
    for source in _status_sources(root):
        pending = source.get("snapshot_tables_pending")
        if isinstance(pending, list) and pending and "name" in source:
            tables = [str(t) for t in pending]
            context = SnapshotContext(pending=tables, check=list(tables), done=None)
            found[context_key(str(source["name"]))] = context.to_json()
    return found


def repaired_key(source: str) -> str:
    """The manifest positions' entry that marks a source's position as rebuilt by a repair ("1";
    "" once capture has resumed from it)."""
    return f"{source}#repaired"


def positions_in(log: RebuiltLog) -> dict[str, str]:
    """Every source position the log's status file and records show (see the module's doc), each
    marked as rebuilt: capture confirms idle positions to the slot only after committing them, and
    those commits went with the manifest, so the slot may start past a rebuilt position with nothing
    of the source's in between (capture then continues from the slot, capture/source.py)."""
    found = confirmed_in_status(log.root)
    for name, lsn in _from_records(log).items():
        found[name] = max(found.get(name, Lsn.ZERO), lsn)
    positions = {name: str(lsn) for name, lsn in found.items()}
    positions.update({repaired_key(name): "1" for name in found})
    positions.update((k, v) for k, v in _snapshots_pending(log.root).items() if k.split("#")[0] in positions)
    return positions
