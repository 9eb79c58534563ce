"""Unchanged-TOAST placeholders in CDC envelopes, pure: which `after` columns hold one, and the
record with them filled from the key's earlier values.

Capture writes `"__tributary_unavailable__"` for a column an UPDATE did not send (an unchanged
out-of-line value, `capture/records/envelope.py`). The value it stands for lives in an older record of
the key; compaction drops that record, so it carries the value forward into the record it keeps
(`compaction.py`), and `log cat --compacted` resolves it the same way. A value is rewritten by
splicing byte ranges: every other byte of it (numerics' exact text, jsonb as captured) is kept.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

__all__ = ["PLACEHOLDER", "Carry", "CarryForward", "fill", "holes", "observe"]

PLACEHOLDER = "__tributary_unavailable__"  # capture.values.UNAVAILABLE (the log imports nothing above it)
_MARK = b'"' + PLACEHOLDER.encode() + b'"'
_LITERAL = _MARK.decode()
_WS = re.compile(r"[ \t\n\r]*")
_WS_CHARS = frozenset(" \t\n\r")
_decoder = json.JSONDecoder()

Carry = dict[str, bytes]
"""Per key and column being resolved: the value (envelope) of the latest record holding a real
value there; its JSON text is copied out when a record is filled."""
Spans = dict[str, tuple[int, int]]


def _skip(text: str, pos: int) -> int:
    if text[pos : pos + 1] not in _WS_CHARS:  # compact JSON (what capture writes): no regex
        return pos
    return _WS.match(text, pos).end()  # type: ignore[union-attr]  # matches the empty string


def _members(text: str, pos: int, *, into: str | None = None) -> tuple[Spans, Spans | None, int]:
    """The object at `pos`: each member's value span, the spans of member `into`'s own members
    when that is an object (None: no such object), and the end. Raises ValueError if malformed."""
    if text[pos] != "{":
        raise ValueError("not an object")
    spans: Spans = {}
    inner: Spans | None = None
    pos = _skip(text, pos + 1)
    if text[pos] == "}":
        return spans, inner, pos + 1
    while True:
        name, pos = _decoder.raw_decode(text, pos)
        if not isinstance(name, str):
            raise ValueError("member name is not a string")
        pos = _skip(text, pos)
        if text[pos] != ":":
            raise ValueError("no colon")
        start = _skip(text, pos + 1)
        if name == into and text[start] == "{":
            inner, _, end = _members(text, start)
        else:
            if name == into:
                inner = None
            _value, end = _decoder.raw_decode(text, start)
        spans[name] = (start, end)
        pos = _skip(text, end)
        if text[pos] == "}":
            return spans, inner, pos + 1
        if text[pos] != ",":
            raise ValueError("no comma")
        pos = _skip(text, pos + 1)


def _after(value: bytes) -> tuple[str, Spans] | None:
    """The value as text and the spans of its `after` object's members (None: not an envelope
    with an `after` object — a tombstone, a delete, an event, a schema record, or not JSON)."""
    try:
        text = value.decode()
        _top, inner, end = _members(text, _skip(text, 0), into="after")
    except (ValueError, IndexError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    if inner is None or _skip(text, end) != len(text):
        return None
    return text, inner


def _row(value: bytes) -> dict[str, Any] | None:
    """An envelope's `after` object decoded (None: not an envelope with one). Only whether a
    column is there and holds the placeholder is read from it; bytes are copied from `_after`."""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:  # JSON orjson refuses (a number beyond a double): scan it
        parsed = _after(value)
        if parsed is None:
            return None
        text, spans = parsed
        return {c: PLACEHOLDER if text[s:e] == _LITERAL else text[s:e] for c, (s, e) in spans.items()}
    after = doc.get("after") if isinstance(doc, dict) else None
    return after if isinstance(after, dict) else None


def holes(value: bytes | None) -> frozenset[str]:
    """The columns of an envelope's `after` that hold the placeholder exactly."""
    if value is None or _MARK not in value:  # the common case: one substring search
        return frozenset()
    row = _row(value)
    return frozenset() if row is None else frozenset(c for c, v in row.items() if v == PLACEHOLDER)


def observe(carry: Carry, value: bytes | None, columns: frozenset[str]) -> None:
    """Fold one record of the key (in offset order) into `carry`, for `columns`: a tombstone or
    a record without a row (a delete) forgets everything — nothing is carried across a delete;
    a real value (null included) replaces the carried one; a placeholder keeps it; a column the
    row lacks (dropped by a schema change) is forgotten, so it is never resurrected."""
    row = None if value is None else _row(value)
    if value is None or row is None:
        carry.clear()
        return
    for c in columns:
        if c not in row:
            carry.pop(c, None)
        elif row[c] != PLACEHOLDER:
            carry[c] = value


def _raw(value: bytes, column: str) -> str | None:
    """The JSON text of `after[column]` in an envelope, exactly as written."""
    parsed = _after(value)
    if parsed is None or column not in parsed[1]:
        return None
    text, spans = parsed
    s, e = spans[column]
    return text[s:e]


def fill(value: bytes, carry: Carry, *, pad: bool = False) -> bytes:
    """`value` with each `after` column that holds the placeholder and has a carried value
    replaced by it (the same bytes when there is none). `pad` puts one space before the first
    value filled: the same JSON, one byte longer (see `compaction._rewrite`)."""
    parsed = _after(value) if _MARK in value else None
    if parsed is None:
        return value
    text, spans = parsed
    found = ((s, e, _raw(carry[c], c)) for c, (s, e) in spans.items() if c in carry and text[s:e] == _LITERAL)
    todo = sorted((s, e, raw) for s, e, raw in found if raw is not None)
    if not todo:
        return value
    parts: list[str] = []
    pos = 0
    for i, (s, e, raw) in enumerate(todo):
        parts += [text[pos:s], " " if pad and i == 0 else "", raw]
        pos = e
    parts.append(text[pos:])
    return "".join(parts).encode()


class CarryForward:
    """One compaction pass's carrying of real values into the records it keeps (pure: fed the
    records, in offset order, by `compaction.compact_partition`).

    First `latest(key, offset, value, previous)` for each record of the dirty section (the pass's
    key map): it notes which keys' latest records hold placeholders. Then `decide` for each record
    of the sealed segments being rewritten, oldest first: it folds the key's values (`observe`)
    and fills the kept record. A key whose latest record lies at or past `sealed_end` (the active
    segment, which a pass never rewrites) keeps its last sealed record as a *carrier* of the
    values (filled the same way) until a later pass can fill the latest one; without it the value
    would be gone before the record that needs it is compactable."""

    def __init__(self, *, clean_end: int, sealed_end: int) -> None:
        self.clean_end = clean_end
        self.sealed_end = sealed_end
        self.wanted: dict[bytes, frozenset[str]] = {}  # key → placeholder columns of its latest record
        self.last_sealed: dict[bytes, int | None] = {}  # key whose latest is unsealed → last sealed offset
        self.carry: dict[bytes, Carry] = {}

    def latest(self, key: bytes, offset: int, value: bytes | None, previous: int | None) -> None:
        """A record of the dirty section, the newest of its key so far (`previous`: the one before
        it there; None: none since the clean end)."""
        cols = holes(value)
        if cols:
            self.wanted[key] = cols
        else:
            self.wanted.pop(key, None)
        if offset >= self.sealed_end and (previous is None or previous < self.sealed_end):
            self.last_sealed[key] = previous  # None: its record below the clean end, if any

    def decide(self, offset: int, key: bytes, value: bytes | None, keep: bool, latest: int) -> tuple[bool, Carry]:
        """Whether to keep a sealed record that the compaction rule kept (`keep`) or dropped, and
        the values to `fill` it with (empty: none). `latest`: the offset of its key's latest record.
        Only keys in `wanted` need asking: the others' records are left to the rule."""
        cols = self.wanted.get(key)
        if cols is None:
            return keep, {}
        carry = self.carry.setdefault(key, {})
        observe(carry, value, cols)
        if latest >= self.sealed_end:
            last = self.last_sealed.get(key)
            if not (offset == last or (last is None and offset < self.clean_end)) or not carry:
                return False, {}
            return True, dict(carry)
        if not keep:
            return False, {}
        del self.carry[key]  # the key's last record in this pass
        return True, carry
