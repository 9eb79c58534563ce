"""Column and row rules per table (`[[sources.rules]]`): what of a row may enter the log. Pure.

Each rule names tables by `schema.table` globs; the first rule whose globs match a table is its
rule. A rule drops columns (`exclude`), replaces values by `mask_chars` asterisks (`mask`), by
the hex SHA-256 of `hash_salt` + the value's text (`hash`: stable while the salt is, so joins on
it still work), or cuts text to `truncate_chars` characters (`truncate`); and keeps only the rows
its `row_filter` (capture/records/row_filter.py) holds true of.

Rules apply to the row dicts envelopes are made of (capture/records/envelope.py), before the
record's key is taken from them: a masked or hashed key column is masked or hashed in the key
too, in every path (snapshot, stream, chunked), so the keys stay equal across paths. A key column
cannot be excluded or truncated (rows would lose or share keys).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import orjson

from tributary.capture.decoding.values import UNAVAILABLE
from tributary.capture.errors import SourceMisconfigured
from tributary.capture.records.row_filter import RowFilter, compile_filter

__all__ = ["RuleSpec", "SourceRules", "TableRules"]

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """One `[[sources.rules]]` entry as configured."""

    tables: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    mask: tuple[str, ...] = ()
    mask_chars: int = 8
    hash: tuple[str, ...] = ()
    hash_salt: str = ""
    truncate: tuple[str, ...] = ()
    truncate_chars: int = 255
    row_filter: str | None = None

    def matches(self, qualified: str) -> bool:
        return any(fnmatchcase(qualified, pattern) for pattern in self.tables)


class TableRules:
    """One table's rule, made for its key: `keeps` a row (the filter), `apply` to a row (columns)."""

    def __init__(self, spec: RuleSpec, key: Sequence[str]) -> None:
        self.exclude = frozenset(spec.exclude)
        self.mask = "*" * spec.mask_chars
        self._masked = frozenset(spec.mask)
        self._salt = spec.hash_salt.encode()
        self._hashed = frozenset(spec.hash)
        self._truncated = frozenset(spec.truncate)
        self._chars = spec.truncate_chars
        self._changed = tuple(sorted(self._masked | self._hashed | self._truncated))
        self.filter: RowFilter | None = compile_filter(spec.row_filter) if spec.row_filter else None
        self.key = tuple(key)

    def keeps(self, row: Row) -> bool:
        """Is the row (its values as read, before `apply`) one to capture?"""
        return self.filter is None or self.filter.keeps(row)

    def keeps_old(self, old: Row | None) -> bool | None:
        """Was an UPDATE's or DELETE's old row in the filter: None when it is not known (the old row
        wal2json sent lacks a column the filter reads: only the key, without REPLICA IDENTITY FULL)."""
        if self.filter is None:
            return True
        if old is None or not self.filter.columns <= old.keys():
            return None
        return self.filter.keeps(old)

    def apply(self, row: Row) -> Row:
        """The row as it may enter the log: excluded columns gone, the others masked, hashed or
        truncated. A copy: the row read stays as it was (the filter and the key check read it)."""
        out = {name: value for name, value in row.items() if name not in self.exclude}
        for name in self._changed:
            if name in out:
                out[name] = self._value(name, out[name])
        return out

    def _value(self, name: str, value: Any) -> Any:
        if value is None or value == UNAVAILABLE:  # no value, or one the server did not send
            return value
        if name in self._masked:
            return self.mask
        if name in self._hashed:
            text = value if isinstance(value, str) else orjson.dumps(value).decode()
            return hashlib.sha256(self._salt + text.encode()).hexdigest()
        return value[: self._chars] if isinstance(value, str) else value


class SourceRules:
    """A source's rules, each table's made once (per key: a key change makes it again)."""

    def __init__(self, source: str, specs: Sequence[RuleSpec]) -> None:
        self.source = source
        self.specs = tuple(specs)
        for spec in self.specs:
            if spec.row_filter:
                compile_filter(spec.row_filter)  # a mistake fails at start, not at the first row
        self._tables: dict[tuple[str, str, tuple[str, ...]], TableRules | None] = {}

    def for_table(self, schema: str, table: str, key: Sequence[str]) -> TableRules | None:
        """The table's rules (None: it has none, its records are as read); SourceMisconfigured
        when the rule would exclude or truncate a key column."""
        at = (schema, table, tuple(key))
        try:
            return self._tables[at]
        except KeyError:
            pass
        qualified = f"{schema}.{table}"
        spec = next((s for s in self.specs if s.matches(qualified)), None)
        rules = None if spec is None else TableRules(spec, key)
        if spec is not None:
            _check_key(self.source, qualified, spec, key)
        if len(self._tables) >= 65536:
            self._tables.clear()
        self._tables[at] = rules
        return rules


def _check_key(source: str, qualified: str, spec: RuleSpec, key: Sequence[str]) -> None:
    """A key column excluded (records without their key) or truncated (rows sharing a key) is refused."""
    for what, columns in (("exclude", spec.exclude), ("truncate", spec.truncate)):
        named = [k for k in key if k in columns]
        if named:
            raise SourceMisconfigured(
                f"source {source!r}: [[sources.rules]] {what} names key column {named[0]!r} of {qualified} "
                f"(a key column can be masked or hashed, not {'excluded' if what == 'exclude' else 'truncated'})"
            )
