"""Column values → the JSON the envelope carries, by PostgreSQL type. Pure.

Two inputs, one output: a streamed value as wal2json printed it, and a snapshot value as
PostgreSQL text (COPY). Both give byte-identical envelope values for the same datum, so a
consumer cannot tell a snapshot row from a streamed one. The mapping (docs/envelope.md):

numeric → JSON string with the exact digits · int2/4/8, oid → number · float4/8 → number
(NaN/±Infinity → null) · bool → true/false · json/jsonb → the JSON itself, embedded verbatim ·
timestamptz → `2024-01-02T03:04:05.123456Z` · timestamp → `2024-01-02T03:04:05.123456` ·
bytea → hex string without `\\x` · 1-D arrays of simple types → JSON arrays · everything else
(date, time, interval, uuid, text, money, enums, geometry, …) → PostgreSQL's text.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import Any, Literal

import orjson

__all__ = [
    "UNAVAILABLE",
    "copy_unescape",
    "from_stream",
    "from_text",
    "parse_array",
    "stream_converter",
    "text_converter",
    "type_family",
]

UNAVAILABLE = "__tributary_unavailable__"  # an unchanged TOASTed value the server did not send

_TYPMOD = re.compile(r"\(\d+(,\d+)?\)")
_INTS = {"smallint", "integer", "bigint", "oid", "int2", "int4", "int8"}
_FLOATS = {"real", "double precision", "float4", "float8"}
_COPY_ESCAPE = re.compile(rb"\\(.)", re.S)
_COPY_CHARS = {b"n": b"\n", b"t": b"\t", b"r": b"\r", b"b": b"\b", b"f": b"\f", b"v": b"\v"}


def _copy_char(match: re.Match[bytes]) -> bytes:
    char = match.group(1)
    return _COPY_CHARS.get(char, char)


copy_unescape = functools.partial(_COPY_ESCAPE.sub, _copy_char)
"""COPY text format's backslash escapes undone (\\n, \\t, …, a doubled backslash): bytes → bytes."""


def type_family(type_name: str) -> str:
    """int | numeric | float | bool | json | tstz | ts | bytea | array:<element family> | text."""
    base = _TYPMOD.sub("", type_name).strip()
    if type_name.endswith("[]"):
        return "array:" + type_family(type_name[:-2])
    if base in _INTS:
        return "int"
    if base in ("numeric", "decimal"):
        return "numeric"
    if base in _FLOATS:
        return "float"
    if base in ("boolean", "bool"):
        return "bool"
    if base in ("json", "jsonb"):
        return "json"
    if base in ("timestamp with time zone", "timestamptz"):
        return "tstz"
    if base in ("timestamp without time zone", "timestamp"):
        return "ts"
    if base == "bytea":
        return "bytea"
    return "text"


def _iso(text: str, *, zone: bool) -> str:
    if text in ("infinity", "-infinity") or text.endswith(" BC"):
        return text
    out = text.replace(" ", "T", 1)
    if zone:
        if out.endswith("+00"):
            return out[:-3] + "Z"
        if out.endswith("+00:00"):
            return out[:-6] + "Z"
    return out


def _float(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else value


def from_text(type_name: str, text: str | None, family: str | None = None) -> Any:
    """A value in PostgreSQL's text output (snapshot COPY, array elements)."""
    if text is None:
        return None
    fam = family or type_family(type_name)
    if fam == "int":
        return int(text)
    if fam == "numeric":
        return text
    if fam == "float":
        return _float(float(text))
    if fam == "bool":
        return text in ("t", "true")
    if fam == "json":
        return orjson.Fragment(text)
    if fam == "tstz":
        return _iso(text, zone=True)
    if fam == "ts":
        return _iso(text, zone=False)
    if fam == "bytea":
        return text[2:] if text.startswith("\\x") else text
    if fam.startswith("array:"):
        return _array(type_name, text, fam)
    return text


def from_stream(type_name: str, value: Any, family: str | None = None) -> Any:
    """A value as wal2json printed it (bare numbers, booleans, otherwise strings)."""
    if value is None:
        return None
    fam = family or type_family(type_name)
    if fam == "numeric":
        return str(value)  # the literal text (or an exact int) from the exact parse path
    if fam == "float":
        return _float(float(value))
    if fam == "int" or fam == "bool":
        return value
    if isinstance(value, str):
        return from_text(type_name, value, fam)
    return value


TextConverter = Callable[[str], object] | None
"""A column's text form (COPY, a snapshot) to its envelope value; None: the text is the value."""

_STREAM_CONVERTERS: dict[str, Any] = {}
_TEXT_CONVERTERS: dict[str, TextConverter] = {}


def _direct(fam: str) -> Callable[[str], object] | Literal[False]:
    """A one-call converter for the families whose stream and text forms are both strings."""
    if fam == "json":
        return orjson.Fragment
    if fam == "tstz":
        return functools.partial(_iso, zone=True)
    if fam == "ts":
        return functools.partial(_iso, zone=False)
    if fam == "bytea":
        return lambda v: v[2:] if v.startswith("\\x") else v
    return False  # no direct form


def stream_converter(type_name: str) -> Any:
    """`from_stream` specialised to one type, cached; None where the value passes unchanged.

    The hot path of capture converts every column of every change: resolving the type once per
    type name instead of once per value is most of the saving."""
    try:
        return _STREAM_CONVERTERS[type_name]
    except KeyError:
        pass
    fam = type_family(type_name)
    conv: Any
    if fam in ("int", "bool", "text"):
        conv = None  # wal2json prints these as JSON numbers, booleans and strings already
    elif fam == "numeric":
        conv = lambda v: None if v is None else str(v)  # noqa: E731
    elif (direct := _direct(fam)) is not False:
        conv = lambda v, f=direct: None if v is None else f(v)  # noqa: E731
    else:
        conv = lambda v, t=type_name, f=fam: from_stream(t, v, f)  # noqa: E731
    _STREAM_CONVERTERS[type_name] = conv
    return conv


def text_converter(type_name: str) -> TextConverter:
    """`from_text` specialised to one type, cached (the snapshot's per-value path); None = as is.
    Callers skip NULLs (None) themselves."""
    try:
        return _TEXT_CONVERTERS[type_name]
    except KeyError:
        pass
    fam = type_family(type_name)
    conv: TextConverter
    if fam in ("text", "numeric"):
        conv = None
    elif fam == "int":
        conv = int
    elif fam == "bool":
        conv = _TRUE.__contains__
    elif (direct := _direct(fam)) is not False:
        conv = direct
    else:
        conv = lambda v, t=type_name, f=fam: from_text(t, v, f)  # noqa: E731
    _TEXT_CONVERTERS[type_name] = conv
    return conv


_TRUE = frozenset(("t", "true"))


def _array(type_name: str, text: str, fam: str) -> Any:
    element_family = fam[len("array:") :]
    if element_family.startswith("array:"):
        return text
    items = parse_array(text)
    if items is None:
        return text  # multi-dimensional or exotic bounds: keep PostgreSQL's literal
    element_type = type_name[:-2]
    return [from_text(element_type, item, element_family) for item in items]


def parse_array(text: str) -> list[str | None] | None:
    """`{1,2,NULL,"a b","q\\"x"}` → ['1', '2', None, 'a b', 'q"x']; None when not 1-D."""
    if not (text.startswith("{") and text.endswith("}")):
        return None
    body = text[1:-1]
    if not body:
        return []
    out: list[str | None] = []
    i, n = 0, len(body)
    while i <= n:
        if i < n and body[i] == "{":
            return None
        if i < n and body[i] == '"':
            i += 1
            buf = []
            while i < n and body[i] != '"':
                if body[i] == "\\" and i + 1 < n:
                    i += 1
                buf.append(body[i])
                i += 1
            out.append("".join(buf))
            i += 1  # closing quote
        else:
            j = body.find(",", i)
            j = n if j < 0 else j
            raw = body[i:j].strip()
            out.append(None if raw == "NULL" else raw)
            i = j
        if i < n and body[i] != ",":
            return None
        i += 1
    return out
