"""Helpers that turn Debezium-style envelopes into the current row of a key, without boilerplate.

Unchanged TOASTed columns arrive as the placeholder `__tributary_unavailable__` in `after`; the
previous value of the key fills them in. A placeholder with no previous value stays visible
(`unresolved` names the columns) rather than being silently nulled.

A truncate (`op: "t"`, no key) reaches a plain fold over a CDC topic as a record of each key with a
record on that topic-partition before it (projections/engine.py); here it reads as a delete, so
`apply_change` gives None for a key truncated after its last change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tributary.projections.records import ProjectionRecord

__all__ = ["TOAST_PLACEHOLDER", "apply_change", "current_row", "resolve_toast", "unresolved"]

TOAST_PLACEHOLDER = "__tributary_unavailable__"
_UPSERT_OPS = ("c", "u", "r")


def current_row(envelope: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The row after this change: `after` for c/u/r, None for a delete or truncate.

    A tombstone (envelope None) says nothing new and also yields None; use `apply_change`
    when the previous row matters."""
    if envelope is None:
        return None
    op = envelope.get("op")
    if op in _UPSERT_OPS:
        after = envelope.get("after")
        return dict(after) if isinstance(after, Mapping) else None
    if op in ("d", "t"):
        return None
    raise ValueError(f"unknown CDC op {op!r}")


def resolve_toast(previous: Mapping[str, Any] | None, after: Mapping[str, Any]) -> dict[str, Any]:
    """`after` with each TOAST placeholder replaced by the previous row's value, when known."""
    out = dict(after)
    if previous is None:
        return out
    for col, val in after.items():
        if val == TOAST_PLACEHOLDER and col in previous:
            out[col] = previous[col]
    return out


def unresolved(row: Mapping[str, Any] | None) -> list[str]:
    """Columns still holding the TOAST placeholder (the previous value was never seen)."""
    return [] if row is None else sorted(c for c, v in row.items() if v == TOAST_PLACEHOLDER)


def apply_change(previous: Mapping[str, Any] | None, record: ProjectionRecord) -> dict[str, Any] | None:
    """Fold step for "current row of the key": upsert with TOAST resolved, delete or truncate →
    None, tombstone or schema record → unchanged (a tombstone follows the delete that removed the
    row)."""
    envelope = record.value
    if not isinstance(envelope, Mapping) or "op" not in envelope:
        # a tombstone, or a schema record (column types travel on the topic too)
        return None if previous is None else dict(previous)
    row = current_row(envelope)
    if row is None:
        return None
    return resolve_toast(previous, row)
