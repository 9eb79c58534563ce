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


def _tagged(obj: object) -> JsonValue:
    """orjson's `default` for what it cannot write itself: a Decimal, tagged as `_enc` tags it."""
    if isinstance(obj, Decimal):
        return {_DEC: format(obj, "f") if obj.is_finite() else str(obj)}
    raise TypeError


def _json(value: object) -> str:
    """`_enc` then sorted-key JSON; the common case (dicts with str keys, Decimals) in one orjson
    call, which writes the same bytes: anything else (other mappings, non-str keys) goes the
    long way."""
    try:
        return orjson.dumps(value, default=_tagged, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return orjson.dumps(_enc(value), option=orjson.OPT_SORT_KEYS).decode()


def dump_state(state: FoldState) -> str:
    """Fold state → JSON text (sorted keys, Decimals tagged); tuples come back as lists."""
    return _json(state)


def load_state(text: str | None) -> FoldState:
    if text is None:
        return None
    obj = orjson.loads(text)
    return _dec(obj) if _DEC in text else obj  # no tag: `_dec` would rebuild it unchanged


def canonical(value: object) -> str:
    """Canonical JSON text (sorted keys, no whitespace): how keys and units are compared."""
    return _json(value)


_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def copy_text(value: object) -> str | None:
    """One value in the text form Postgres parses for any column type (None stays None = NULL)."""
    if value is None:
        return None
    if type(value) is str:  # the common case first
        return value
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
    line = "\t".join("\\N" if v is None else v for v in values)
    clean = line.count("\\") == values.count(None) and line.count("\t") == len(values) - 1
    if not clean or "\n" in line or "\r" in line:  # some value needs escaping (rare): the long way
        line = "\t".join("\\N" if v is None else v.translate(_ESCAPES) for v in values)
    return line + "\n"
