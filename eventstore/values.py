"""What the store can hold: the checks that turn an unstorable id or value into `InvalidValue`.

PostgreSQL's `text` and `jsonb` cannot hold NUL, UTF-8 cannot encode an unpaired UTF-16 surrogate
(JSON's `\\ud83d` escape decodes to one), the event codec writes integers of at most 64 bits, and a
btree index entry has a size limit (`UNIQUE (stream_id, version)`): refused here, with the field
named, before anything reaches the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tributary.eventstore.errors import InvalidValue
from tributary.jsonvalue import JsonValue

__all__ = [
    "MAX_HEADERS",
    "MAX_HEADER_NAME",
    "MAX_HEADER_VALUE",
    "MAX_ID_LENGTH",
    "RESERVED_HEADERS",
    "check_data",
    "check_headers",
    "check_id",
    "text_problem",
]

MAX_ID_LENGTH = 200  # characters of a stream id or command id (far below the btree entry limit in UTF-8)
# User headers (an event's `metadata.headers`, the log record's headers): string names and values,
# bounded so that metadata stays small beside the event (a log record carries it on every copy).
MAX_HEADERS = 32
MAX_HEADER_NAME = 100
MAX_HEADER_VALUE = 1000
RESERVED_HEADERS = frozenset({"command_id", "correlation_id", "causation_id"})  # the ids beside them
_MIN_INT, _MAX_INT = -(2**63), 2**64  # what the JSON codec (orjson) writes


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored, or None."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which PostgreSQL cannot store; remove it"
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError as exc:
            return (
                f"contains an unpaired UTF-16 surrogate ({ascii(text[exc.start])} at index {exc.start}); "
                "send valid Unicode"
            )
    return None


def check_id(field: str, value: str) -> None:
    """A stream or command id: 1 to MAX_ID_LENGTH characters the database can store."""
    if not value:
        raise InvalidValue(field, "is empty")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidValue(field, f"is {len(value)} characters long; the maximum is {MAX_ID_LENGTH}")
    problem = text_problem(value)
    if problem is not None:
        raise InvalidValue(field, problem)


def check_data(field: str, data: JsonValue) -> None:
    """Every key and value of a JSON-like tree storable as `jsonb` (walked without recursion: a
    deeply nested body must not exhaust the stack)."""
    stack: list[tuple[str, Any]] = [(field, data)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            problem = text_problem(value)
            if problem is not None:
                raise InvalidValue(where, problem)
        elif isinstance(value, bool):
            continue
        elif isinstance(value, int):
            if not _MIN_INT <= value < _MAX_INT:
                raise InvalidValue(where, "is an integer beyond 64 bits; send it as a string")
        elif isinstance(value, Mapping):
            for key, item in value.items():
                name = str(key)
                problem = text_problem(name)
                if problem is not None:
                    raise InvalidValue(f"a key of {where}", problem)
                stack.append((f"{where}.{name}" if name.isidentifier() else f"{where}[{name!r}]", item))
        elif isinstance(value, list | tuple):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))


def check_headers(headers: Mapping[str, Any]) -> None:
    """User headers: at most MAX_HEADERS, string names (1 to MAX_HEADER_NAME characters, none of
    RESERVED_HEADERS) and string values of at most MAX_HEADER_VALUE characters."""
    if len(headers) > MAX_HEADERS:
        raise InvalidValue("headers", f"has {len(headers)} entries; the maximum is {MAX_HEADERS}")
    for name, value in headers.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_HEADER_NAME:
            raise InvalidValue("headers", f"has a name that is not 1 to {MAX_HEADER_NAME} characters: {name!r:.120}")
        if name in RESERVED_HEADERS:
            raise InvalidValue(f"headers.{name}", "is reserved: send it as the command's own field")
        if not isinstance(value, str):
            raise InvalidValue(f"headers.{name}", f"is a {type(value).__name__}; header values are strings")
        if len(value) > MAX_HEADER_VALUE:
            raise InvalidValue(f"headers.{name}", f"is {len(value)} characters long; the maximum is {MAX_HEADER_VALUE}")
        for problem in (text_problem(name), text_problem(value)):
            if problem is not None:
                raise InvalidValue(f"headers.{name}", problem)
