"""Encodings the runner needs, pure: fold state ⇄ JSON (Decimals survive), values → COPY text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, TypeAlias

import orjson

from tributary.jsonvalue import JsonValue

__all__ = ["FoldState", "canonical", "copy_line", "copy_text", "dump_state", "load_state"]

_DEC = "$decimal"

FoldState: TypeAlias = Any
"""A fold's state as the user's `initial` and `apply` make it: JSON values and Decimals, nested
(tuples come back as lists). Any: its shape is the projection's own."""


def _enc(obj: object) -> JsonValue:
    if isinstance(obj, Decimal):
        return {_DEC: format(obj, "f") if obj.is_finite() else str(obj)}
    if isinstance(obj, Mapping):
        return {str(k): _enc(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_enc(v) for v in obj]
    return obj


def _dec(obj: JsonValue) -> FoldState:
    if isinstance(obj, dict):
        if len(obj) == 1 and _DEC in obj:
            return Decimal(obj[_DEC])
        return {k: _dec(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_dec(v) for v in obj]
    return obj


def dump_state(state: FoldState) -> str:
    """Fold state → JSON text (sorted keys, Decimals tagged); tuples come back as lists."""
    return orjson.dumps(_enc(state), option=orjson.OPT_SORT_KEYS).decode()


def load_state(text: str | None) -> FoldState:
    return None if text is None else _dec(orjson.loads(text))


def canonical(value: object) -> str:
    """Canonical JSON text (sorted keys, no whitespace): how keys and units are compared."""
    return orjson.dumps(_enc(value), option=orjson.OPT_SORT_KEYS).decode()


_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_text(value: object) -> str | None:
    """One value in the text form Postgres parses for any column type (None stays None = NULL)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, Decimal):
        return format(value, "f") if value.is_finite() else str(value)
    if isinstance(value, int | float | str):
        return str(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Mapping | list | tuple):
        return orjson.dumps(_enc(value), option=orjson.OPT_SORT_KEYS).decode()
    return str(value)


def copy_line(values: Sequence[str | None]) -> str:
    """A COPY text-format line from already-rendered values."""
    return "\t".join("\\N" if v is None else v.translate(_ESCAPES) for v in values) + "\n"
