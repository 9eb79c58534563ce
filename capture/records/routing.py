"""Which tables a source captures and which topic each goes to. Pure."""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "KEY_FIELD",
    "SIDE_TOPICS",
    "Route",
    "Routing",
    "TableFilter",
    "is_side_topic",
    "table_keys",
    "table_topic",
    "topic_name",
    "topic_part",
    "topic_problems",
    "without_field",
]

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


KEY_FIELD = "__dbz__physicalTableIdentifier"  # Debezium's ByLogicalTableRouter key.field.name default
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")  # a topic name the local log and Kafka both take


@dataclass(frozen=True, slots=True)
class Route:
    """One `[[sources.routes]]` entry: the tables it takes (a `schema.table` glob, or a regex over
    `schema.table`) and their topic, where `{source}`, `{schema}`, `{table}` (and, for a regex,
    its groups `\\1`…) are filled in (Debezium: topic.regex, topic.replacement)."""

    topic: str
    tables: str | None = None
    regex: str | None = None

    def apply(self, source: str, schema: str, table: str) -> str | None:
        """The topic this route gives the table, or None when the route does not take it."""
        name = f"{schema}.{table}"
        if self.regex is not None:
            match = re.fullmatch(self.regex, name)
            if match is None:
                return None
            topic = match.expand(self.topic)
        elif self.tables is not None and fnmatch.fnmatchcase(name, self.tables):
            topic = self.topic
        else:
            return None
        return (
            topic.replace("{source}", source)
            .replace("{schema}", topic_part(schema))
            .replace("{table}", topic_part(table))
        )


class Routing:
    """A source's routes, compiled once: (schema, table) → topic, and the key field that keeps
    the keys of tables sharing a topic distinct (Debezium's ByLogicalTableRouter). Pure."""

    def __init__(self, source: str, routes: Iterable[Route], key_field: str | None = KEY_FIELD) -> None:
        self.source = source
        self.routes = tuple(routes)
        self.key_field = key_field  # None: key.enforce.uniqueness = false
        self._cache: dict[tuple[str, str], tuple[str, tuple[str, str] | None, bool]] = {}

    def resolve(self, schema: str, table: str) -> tuple[str, tuple[str, str] | None]:
        """(topic, (key field, value) or None): the first route that takes the table, else the
        table's own topic and no key field. The value is the table's own topic (as Debezium's)."""
        return self._resolved(schema, table)[:2]

    def _resolved(self, schema: str, table: str) -> tuple[str, tuple[str, str] | None, bool]:
        """(topic, key field, routed), worked out once per table: the stream asks per change."""
        key = (schema, table)
        hit = self._cache.get(key)
        if hit is None:
            own = topic_name(self.source, schema, table)
            routed = next((t for r in self.routes if (t := r.apply(self.source, schema, table)) is not None), None)
            if routed is None:
                hit = (own, None, False)
            else:
                hit = (routed, None if self.key_field is None else (self.key_field, own), True)
            if len(self._cache) >= 4096:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def topic(self, schema: str, table: str) -> str:
        return self._resolved(schema, table)[0]

    def routed(self, schema: str, table: str) -> bool:
        """Does a route take the table? Its records then take the per-row paths only (the fast
        paths build keys without the key field)."""
        return self._resolved(schema, table)[2]

    def key_value(self, schema: str, table: str) -> tuple[str, str] | None:
        return self.resolve(schema, table)[1]


def table_topic(routing: Routing | None, source: str, schema: str, table: str) -> tuple[str, tuple[str, str] | None]:
    """A table's topic and key field: its route's, else `<source>.<schema>.<table>` and none."""
    return (topic_name(source, schema, table), None) if routing is None else routing.resolve(schema, table)


def table_keys(keys: Iterable[bytes], field: tuple[str, str] | None) -> set[bytes]:
    """The keys of a topic that are one table's: those whose key field names it (a routed topic
    holds other tables' keys too); all of them when the table has no key field."""
    if field is None:
        return set(keys)
    name, value = field
    return {k for k in keys if _field_value(k, name) == value}


def without_field(key: bytes, name: str) -> bytes:
    """A key without its key field: the key its table's columns make (canonical JSON)."""
    doc = orjson.loads(key)
    doc.pop(name, None)
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def _field_value(key: bytes, name: str) -> Any:
    try:
        doc = orjson.loads(key)
    except orjson.JSONDecodeError:
        return None
    return doc.get(name) if isinstance(doc, dict) else None


def topic_problems(routing: Routing, tables: Iterable[tuple[str, str, tuple[Any, ...], tuple[Any, ...]]]) -> list[str]:
    """One line per problem `init` refuses: a routed topic name that is not valid; tables sharing
    a topic whose keys could collide (a table not routed there, whose keys lack the key field) or
    whose key columns or columns differ (the topic's schema record describes them all). `tables`:
    (schema, table, key columns, columns)."""
    by_topic: dict[str, list[tuple[str, str, tuple[Any, ...], tuple[Any, ...]]]] = {}
    for entry in tables:
        by_topic.setdefault(routing.topic(entry[0], entry[1]), []).append(entry)
    problems = []
    for topic, named in sorted(by_topic.items()):
        first = f"{named[0][0]}.{named[0][1]}"
        if not _TOPIC.fullmatch(topic):
            problems.append(
                f"{first}: routed topic {topic!r} is not a valid topic name (letters, digits, '.', '_', '-')"
            )
            continue
        for schema, table, key, columns in named[1:]:
            other, why = f"{schema}.{table}", None
            if not (routing.routed(named[0][0], named[0][1]) and routing.routed(schema, table)):
                why = "one of them is not routed, so its keys lack the key field"
            elif key != named[0][2]:
                why = "their key columns differ"
            elif columns != named[0][3]:
                why = "their columns differ"
            if why is not None:
                problems.append(f"{first} and {other} cannot share topic {topic}: {why}")
                break
    return problems


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
