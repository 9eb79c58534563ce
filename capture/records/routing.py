"""Which tables a source captures and which topic each goes to. Pure."""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import re
from collections.abc import Iterable

__all__ = ["SIDE_TOPICS", "TableFilter", "is_side_topic", "topic_name", "topic_part"]

_PLAIN = re.compile(r"[A-Za-z0-9_-]+")
_INVALID = re.compile(r"[^A-Za-z0-9_-]")


@functools.lru_cache(maxsize=4096)
def topic_part(name: str) -> str:
    """One identifier as a part of a topic name: kept as it is when it holds only ASCII letters,
    digits, `_` and `-`; else each other character (space, `.`, `$`, quotes, non-ASCII letters…)
    becomes `_` and `_` + 8 hex digits of the SHA-256 of the identifier's UTF-8 bytes follow, so
    two identifiers that differ only there never share a topic, and the name never changes."""
    if _PLAIN.fullmatch(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{_INVALID.sub('_', name)}_{digest}"


def topic_name(source: str, schema: str, table: str) -> str:
    """CDC topic of a table: `<source>.<schema>.<table>`, each identifier mapped by `topic_part`
    (a valid topic name on the local log and on Kafka for any PostgreSQL identifier)."""
    return f"{source}.{topic_part(schema)}.{topic_part(table)}"


SIDE_TOPICS = ("messages", "transactions", "heartbeat", "notifications")
"""A source's topics that are no table's: `<source>.<kind>`, records kept by retention, never compacted."""


def is_side_topic(topic: str) -> bool:
    """`<source>.messages`, `.transactions`, `.heartbeat` or `.notifications`: one dot (a source
    name has none; a table's topic has two), so a table named `transactions` stays a table."""
    source, dot, kind = topic.partition(".")
    return bool(dot) and kind in SIDE_TOPICS and source != "events"


_SIMPLE = re.compile(r"^(\*|[A-Za-z_][A-Za-z0-9_$]*)\.(\*|[A-Za-z_][A-Za-z0-9_$]*)$")


class TableFilter:
    """`schema.table` globs (`*`, `?`, `[…]`, case-sensitive): included and not excluded."""

    def __init__(self, include: Iterable[str], exclude: Iterable[str] = ()) -> None:
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        for pattern in (*self.include, *self.exclude):
            if "." not in pattern:
                raise ValueError(f"table pattern {pattern!r} must be schema.table (globs allowed, e.g. public.*)")
        self._cache: dict[tuple[str, str], bool] = {}

    def matches(self, schema: str, table: str) -> bool:
        key = (schema, table)
        hit = self._cache.get(key)
        if hit is None:
            name = f"{schema}.{table}"
            hit = any(fnmatch.fnmatchcase(name, p) for p in self.include) and not any(
                fnmatch.fnmatchcase(name, p) for p in self.exclude
            )
            self._cache[key] = hit
        return hit

    def snapshot_rank(self, schema: str, table: str) -> tuple[int, str]:
        """Where a table stands in Debezium's snapshot order: by the first include pattern it
        matches, then by name (`schema.table`) among that pattern's tables."""
        name = f"{schema}.{table}"
        first = next((i for i, p in enumerate(self.include) if fnmatch.fnmatchcase(name, p)), len(self.include))
        return first, name

    def wal2json_options(self) -> dict[str, str]:
        """`add-tables` when every include pattern is one wal2json understands, so the server
        skips other tables' rows; the Python filter still applies (exclude, finer globs)."""
        if not self.include or not all(_SIMPLE.match(p) for p in self.include):
            return {}
        if any(p == "*.*" for p in self.include):
            return {}
        return {"add-tables": ",".join(self.include)}
