"""Names for JSON whose shape the code does not fix: a command's data, a record's value, a
problem's extensions, a fold's state as stored.

The bottom layer, beside `impl`: every package may name these; this module imports nothing of the project.
"""

from __future__ import annotations

from typing import Any, TypeAlias

__all__ = ["JsonObject", "JsonValue"]

JsonValue: TypeAlias = Any
"""One JSON value as decoded (orjson, FastAPI's `jsonable_encoder`) or about to be encoded: a dict
with string keys, a list, a string, an int, a float, a bool or None, nested. Any rather than their
union: the shape is the user's to know (`record.value["amount"]` in a fold, `data["items"]` in a
`decide`), and a union would have every such reader narrow each step."""

JsonObject: TypeAlias = dict[str, JsonValue]
"""A JSON object: a problem's body, a command's data, an event's metadata."""
