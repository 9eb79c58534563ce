"""Configuration problems in the user's words: one line each, naming the key as the TOML file (or
the `TRIBUTARY_*` variable) spells it, with a did-you-mean for a misspelt key.

Pydantic's own wording ("Extra inputs are not permitted", "sources.0.nmae") names neither the
table nor the fix; this module turns each validation error into such a line."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from tributary.api.settings.environment import model_of, union_members

__all__ = ["ConfigError", "describe", "describe_toml_bytes", "describe_toml_syntax"]

Loc = tuple[int | str, ...]


class ConfigError(Exception):
    """Configuration problems, phrased for the user: one line each, naming the key and where it
    was set (`problems`); `str()` is all of them, one per line."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems: tuple[str, ...] = problems


def _field(model: type[BaseModel], key: int | str) -> FieldInfo | None:
    for name, info in model.model_fields.items():
        if key in (name, info.alias):
            return info
    return None


def _walk(model: type[BaseModel], loc: Loc) -> tuple[object, FieldInfo | None]:
    """The annotation (and the field) at `loc`, following tables, keys and list items."""
    annotation: object = model
    info: FieldInfo | None = None
    for part in loc:
        if isinstance(part, int):
            items = [a for m in union_members(annotation) for a in get_args(m) if a is not Ellipsis]
            annotation, info = (items[0] if items else None), None
            continue
        section = model_of(annotation)
        info = _field(section, part) if section is not None else None
        annotation = info.annotation if info is not None else None
    return annotation, info


def _keys(model: type[BaseModel]) -> list[str]:
    return [info.alias or name for name, info in model.model_fields.items()]


def _place(model: type[BaseModel], loc: Loc, data: Mapping[str, Any]) -> str:
    """`[api] port`, `[[sources]] dsn` (`[[sources]] #2 dsn` when there are several), `pg_data_dir`."""
    if not loc:
        return "the top level"
    head, rest = str(loc[0]), list(loc[1:])
    annotation, _ = _walk(model, (head,))
    if model_of(annotation) is not None:
        text = f"[{head}]"
    elif model_of(_walk(model, (head, 0))[0]) is not None:  # an array of tables
        text = f"[[{head}]]"
        index = rest[0] if rest else None
        if isinstance(index, int):
            rest.pop(0)
            entries = data.get(head)
            if isinstance(entries, list | tuple) and len(entries) > 1:
                text += f" #{index + 1}"
    else:
        text = head
    for part in rest:
        text += f" #{part + 1}" if isinstance(part, int) else f" {part}"
    return text


def _show(value: object, secret: bool = False) -> str:
    """The offending value, short; never a secret, never a whole table."""
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if secret and isinstance(value, str):
        return "a string" if value else "''"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bounds(info: FieldInfo | None, ctx: Mapping[str, Any]) -> str:
    """'between 4096 and 4294967295', 'at least 0', … from the field's own limits (both ends)."""
    limits = dict(ctx)
    for meta in info.metadata if info is not None else ():
        for name in ("ge", "gt", "le", "lt"):
            if getattr(meta, name, None) is not None:
                limits[name] = getattr(meta, name)
    if "ge" in limits and "le" in limits:
        return f"between {limits['ge']} and {limits['le']}"
    words = {"ge": "at least", "gt": "greater than", "le": "at most", "lt": "less than"}
    return " and ".join(f"{word} {limits[name]}" for name, word in words.items() if name in limits)


_EXPECTED = {
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "float_type": "a number",
    "finite_number": "a finite number",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "path_type": "a path (a string)",
    "tuple_type": "an array",
    "list_type": "an array",
    "model_type": "a table",
    "model_attributes_type": "a table",
    "dict_type": "a table",
}


def _what(error: ErrorDetails, info: FieldInfo | None, secret: bool) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_show(value, secret)}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return f"must be {_bounds(info, ctx)}, got {_show(value, secret)}"
    if kind == "literal_error":
        return f"expected {ctx.get('expected')}, got {_show(value, secret)}"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}, got {_show(value, secret)}"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return f"{error['msg'][:1].lower()}{error['msg'][1:]}, got {_show(value, secret)}"


def _unknown(model: type[BaseModel], loc: Loc, data: Mapping[str, Any]) -> tuple[str, str | None]:
    """The line for an unknown key, and the key it most likely meant (if any)."""
    key, container = str(loc[-1]), loc[:-1]
    annotation, _ = _walk(model, container)
    section = model_of(annotation) if container else model
    candidates = _keys(section) if section is not None else []
    meant = difflib.get_close_matches(key, candidates, n=1)
    if not container:
        value = data.get(key)
        if isinstance(value, dict) or (isinstance(value, list) and value and isinstance(value[0], dict)):
            spelt = f"[{key}]" if isinstance(value, dict) else f"[[{key}]]"
            hint = f" — did you mean {_place(model, (meant[0],), data)}?" if meant else ""
            return f"unknown section {spelt}{hint}", None
        sections = {name: model_of(info.annotation) for name, info in model.model_fields.items()}
        homes = [f"[{name}]" for name, section in sections.items() if section is not None and key in _keys(section)]
        if not meant and homes:
            return f"unknown key '{key}' at the top level — it belongs in {' or '.join(homes)}", None
        hint = f" — did you mean '{meant[0]}'?" if meant else ""
        return f"unknown key '{key}' at the top level{hint}", None
    hint = f" — did you mean '{meant[0]}'?" if meant else f" (known keys: {', '.join(candidates)})"
    return f"unknown key '{key}' in {_place(model, container, data)}{hint}", meant[0] if meant else None


def _origin(loc: Loc, origin: str, provenance: Mapping[tuple[str, ...], str]) -> str:
    """The variable that set `loc` (the longest match), else the file."""
    parts = tuple(str(p) for p in loc)
    for n in range(len(parts), 0, -1):
        if parts[:n] in provenance:
            return provenance[parts[:n]]
    return origin


_SECRET_KEYS = frozenset({"key", "dsn", "password"})


def describe(
    exc: ValidationError,
    model: type[BaseModel],
    data: Mapping[str, Any],
    *,
    origin: str,
    provenance: Mapping[tuple[str, ...], str],
) -> list[str]:
    """One line per problem in `exc` (every one of them), each as
    `config error in <file or variable>: <key>: <what is wrong>`."""
    lines: list[tuple[Loc, str]] = []
    meant: set[Loc] = set()
    for error in exc.errors():
        loc = tuple(error["loc"])
        if error["type"] == "extra_forbidden":
            line, guess = _unknown(model, loc, data)
            if guess is not None:
                meant.add((*loc[:-1], guess))
            lines.append((loc, line))
    for error in exc.errors():
        loc = tuple(error["loc"])
        if error["type"] == "extra_forbidden":
            continue
        if error["type"] == "missing":
            if loc in meant:  # "unknown key 'nmae' — did you mean 'name'?" already says it
                continue
            where = _place(model, loc[:-1], data) if loc[:-1] else "the top level"
            lines.append((loc, f"{where}: missing required key '{loc[-1]}'"))
            continue
        _, info = _walk(model, loc)
        secret = bool(loc) and str(loc[-1]) in _SECRET_KEYS
        lines.append((loc, f"{_place(model, loc, data)}: {_what(error, info, secret)}"))
    return [f"config error in {_origin(loc, origin, provenance)}: {line}" for loc, line in lines]


_HEADER = re.compile(r"^\s*(\[\[?[^\]]*\]\]?)")
_TOML_AT = re.compile(r"^(?P<what>.*) \(at line (?P<line>\d+), column (?P<column>\d+)\)$")


def _where(lines: list[str], line_no: int) -> str:
    """`line 5, [[sources]] name`: a line of the file with the table and key it is in."""
    line = lines[line_no - 1] if 0 < line_no <= len(lines) else ""
    key = line.split("=", 1)[0].strip() if "=" in line else ""
    header = ""
    for previous in reversed(lines[: line_no - 1]):
        found = _HEADER.match(previous)
        if found:
            header = found.group(1) + " "
            break
    return f"line {line_no}" + (f", {header}{key}" if key else "")


def describe_toml_bytes(path: Path, raw: bytes, exc: UnicodeDecodeError) -> str:
    """The line for a file that is not UTF-8: where the bad byte is and under which key."""
    line_no = raw.count(b"\n", 0, exc.start) + 1
    where = _where(raw.decode("utf-8", "replace").split("\n"), line_no)
    return f"config error in {path}: {where}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the file as UTF-8"


def describe_toml_syntax(path: Path, text: str, exc: ValueError) -> str:
    """The line for a TOML syntax error, with the table and key of the line it points at."""
    message = str(exc)
    at = _TOML_AT.match(message)
    if at is None:  # "(at end of document)": no line to point at
        return f"config error in {path}: {message[:1].lower()}{message[1:]}"
    where = _where(text.split("\n"), int(at["line"]))
    what = at["what"]
    return f"config error in {path}: {where}: {what[:1].lower()}{what[1:]} (column {at['column']})"
