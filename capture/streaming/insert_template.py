"""A table's INSERT as pre-serialised pieces: a wal2json document → (key, value) by byte splicing. Pure.

An INSERT's wal2json v2 document is the same bytes for every row of a table except the
transaction fields, the change's LSN and the column values:

    {"action":"I",…,"lsn":"0/1926638","schema":"public","table":"t","columns":[{"name":"id",
    "type":"bigint","typeoid":20,"value":1},{…,"value":"x"}],"pk":[{"name":"id",…}]}

Splitting it at `,"value":` (a raw `"` cannot occur inside a JSON string, so every split is
structural) leaves each value token at the start of a piece whose end is constant for the table.
The template checks those constant ends, turns each token into the envelope's JSON by the
cheapest exact rule for its type, and formats the key and the envelope from bytes laid out once
per table. Anything it is not sure of (an unexpected shape, a `\\u` escape, a year beyond 9999,
infinity, BC, a 65-bit integer) answers None and the change takes the generic path
(capture.envelope), which stays the reference: tests hold both byte-identical on real wal2json.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from itertools import repeat
from operator import itemgetter, lshift, or_
from typing import Any

import orjson

from tributary.capture import compiled
from tributary.capture.decoding.values import stream_converter, type_family
from tributary.capture.decoding.wal2json import Change
from tributary.capture.records import envelope as env
from tributary.capture.records.routing import topic_name

__all__ = ["SPLIT", "InsertTemplate", "table_tag", "table_tags"]

SPLIT = b',"value":'
_SCHEMA = b'","schema":'
_LSN = b',"lsn":'
_INSERT = b'{"action":"I",'
_NULL = b"null"

Token = Callable[[bytes], bytes | None]  # a wal2json value token → the envelope's JSON, None = not sure


def table_tag(head: bytes) -> bytes:
    """What identifies a template: the document's head from `","schema":` on (schema, table and
    the first column's name and type), after the transaction fields and the LSN."""
    return head[head.rfind(_SCHEMA) :]


def table_tags(payloads: list[bytes], likely: bytes = b"") -> list[bytes]:
    """`table_tag` of each whole document (its first `","schema":` up to its first `,"value":`).
    `likely`: a tag to try first for all of them (one check each instead of a search and a slice)."""
    starts = list(map(bytes.find, payloads, repeat(_SCHEMA)))
    if likely and all(map(bytes.startswith, payloads, repeat(likely + SPLIT), starts)):
        return [likely] * len(payloads)
    stops = map(bytes.find, payloads, repeat(SPLIT))
    return list(map(bytes.__getitem__, payloads, map(slice, starts, stops)))


def _string(tok: bytes) -> bytes | None:
    # Quoted (the document holds no `\u` escape: checked once per change), or null. A bare token
    # for a type we expect quoted goes the generic way.
    return tok if tok[:1] == b'"' or tok == _NULL else None


def _plain_string(tok: bytes) -> bytes | None:
    return tok if tok == _NULL or (tok[:1] == b'"' and 92 not in tok) else None


def _numeric(tok: bytes) -> bytes | None:
    # The exact parse keeps a fraction's literal text and an integer's digits: `"` + token + `"`
    # (NaN/Infinity arrive as null). "-0" would parse to the int 0.
    if tok == _NULL:
        return tok
    if tok in (b"-0", b"") or tok[:1] == b'"':
        return None
    return b'"%b"' % tok


def _tstz(tok: bytes) -> bytes | None:
    # "2024-01-02 03:04:05.5+00" → "2024-01-02T03:04:05.5Z" (TimeZone=UTC): `values._iso` on
    # bytes. Another year width, BC, infinity or another offset spelling: not sure.
    if tok[5:6] == b"-" and tok.find(b" ") == 11 and tok.endswith(b'+00"'):
        return tok[:11] + b"T" + tok[12:-4] + b'Z"'
    return tok if tok == _NULL else None


def _ts(tok: bytes) -> bytes | None:
    if tok[5:6] == b"-" and tok.find(b" ") == 11 and not tok.endswith(b' BC"'):
        return tok[:11] + b"T" + tok[12:]
    return tok if tok == _NULL else None


def _strings(toks: list[bytes]) -> list[bytes] | None:
    if all(map(bytes.startswith, toks, repeat(_QUOTE_OR_NULL))) and not any(
        map(bytes.__contains__, toks, repeat(b"\\u"))
    ):
        return toks
    return None


def _tstzs(toks: list[bytes]) -> list[bytes] | None:
    """`_tstz` over a column at C speed (a column without nulls, all of the usual shape)."""
    if (
        _NULL in toks
        or not all(map(bytes.endswith, toks, repeat(b'+00"')))
        or set(map(bytes.find, toks, repeat(b" "))) != _AT_11
        or set(map(bytes.find, toks, repeat(b"-"))) != _AT_5
    ):
        return _each(_tstz, toks)
    # A `"` inside a JSON string follows a backslash: `+00"` is the token's end and nowhere else.
    return list(
        map(
            bytes.replace,
            map(bytes.replace, toks, repeat(b" "), repeat(b"T"), repeat(1)),
            repeat(b'+00"'),
            repeat(b'Z"'),
        )
    )


def _tss(toks: list[bytes]) -> list[bytes] | None:
    if (
        _NULL in toks
        or any(map(bytes.endswith, toks, repeat(b' BC"')))
        or set(map(bytes.find, toks, repeat(b" "))) != _AT_11
        or set(map(bytes.find, toks, repeat(b"-"))) != _AT_5
    ):
        return _each(_ts, toks)
    return list(map(bytes.replace, toks, repeat(b" "), repeat(b"T"), repeat(1)))


def _each(rule: Token, toks: list[bytes]) -> list[bytes] | None:
    out = list(map(rule, toks))
    return None if None in out else out  # type: ignore[return-value]  # no None in it (checked): list[bytes]


# The typed twin's code for each byte rule (capture/_hotpath.pyx); a generic rule goes as itself.
_C_CODES: dict[Token | None, int] = {None: 0, _numeric: 1, _tstz: 2, _ts: 3, _plain_string: 4, _string: 5}
_QUOTE_OR_NULL = (b'"', _NULL)
_AT_11 = {11}
_AT_5 = {5}
_COLUMN_RULES: dict[Token, Callable[[list[bytes]], list[bytes] | None]] = {_string: _strings, _tstz: _tstzs, _ts: _tss}


def _generic(type_name: str) -> Token:
    """Parse the one token and convert it as the reference does (floats, arrays, json, …)."""
    conv = stream_converter(type_name)

    def token(tok: bytes) -> bytes | None:
        try:
            value = -0.0 if tok == b"-0" else orjson.loads(tok)  # a float's -0: the sign kept
            return orjson.dumps(value if conv is None else conv(value))
        except (orjson.JSONDecodeError, orjson.JSONEncodeError, ValueError, TypeError):
            return None

    return token


def _token_rule(type_name: str) -> Token | None:
    fam = type_family(type_name)
    if fam in ("int", "bool"):
        return None  # wal2json prints the JSON number / true / false orjson would: as is
    if fam == "numeric":
        return _numeric
    if fam == "tstz":
        return _tstz
    if fam == "ts":
        return _ts
    if fam == "bytea":
        return _plain_string  # bare hex; an escape-format `\x…` takes the generic path
    if fam == "text":
        return _string
    return _generic(type_name)


class InsertTemplate:
    """One table's INSERT shape (names, types, key) → key and value bytes without parsing JSON."""

    __slots__ = (
        "announced",
        "topic",
        "_cuts",
        "_ends",
        "_escapes",
        "_key_at",
        "_key_fmt",
        "_n",
        "_rules",
        "_spec",
        "_tag_len",
        "_head_cut",
        "_value_fmt",
    )

    def __init__(
        self,
        *,
        topic: str,
        tag: bytes,
        ends: Sequence[bytes],
        types: Sequence[str],
        names: Sequence[str],
        key_columns: Sequence[str],
        source_head: bytes,
        announced: object,
    ) -> None:
        self.topic = topic
        self.announced = announced  # the SchemaTracker version this shape was seen under
        self._tag_len = len(tag)
        self._head_cut = slice(0, -len(tag))  # a head without its tag: `{"action":"I",…,"lsn":"X/Y`
        self._n = len(names) + 1  # pieces of a split document
        self._ends = tuple(ends)  # each piece's constant end after its value token
        self._cuts = tuple(slice(0, -len(end)) for end in ends)
        rules = [(i, _token_rule(t)) for i, t in enumerate(types)]
        self._rules = tuple((i, rule) for i, rule in rules if rule is not None)
        self._escapes = any(rule is _string for _, rule in rules)  # a `\u` anywhere: not sure
        index = {name: i for i, name in enumerate(names)}
        keys = sorted(key_columns or names)  # orjson's OPT_SORT_KEYS order
        self._key_at = tuple(index[k] for k in keys)
        self._key_fmt = b"{" + b",".join(_fmt_name(k) for k in keys) + b"}"
        after = b"{" + b",".join(_fmt_name(n) for n in names) + b"}"
        # `env._stream_value(None, after, env._source_json(…), "c", now_ms)` laid out once: after,
        # the change's LSN, `,"txId":…,"snapshot":"false"}` (per transaction), now_ms.
        self._value_fmt = (
            b'{"before":null,"after":'
            + after
            + b',"source":'
            + source_head.replace(b"%", b"%%")
            + b'%d%b,"op":"c","ts_ms":%d}'
        )
        # The same layout as constant pieces around the tokens, for the typed twin.
        key_names = [orjson.dumps(k) + b":" for k in keys]
        value_names = [orjson.dumps(n) + b":" for n in names]
        self._spec = (
            self._ends,
            tuple(_C_CODES.get(rule, rule) for _, rule in rules),
            self._tag_len,
            self._key_at,
            (b"{" + key_names[0], *(b"," + k for k in key_names[1:]), b"}"),
            (
                b'{"before":null,"after":{' + value_names[0],
                *(b"," + v for v in value_names[1:]),
                b'},"source":' + source_head,
            ),
        )

    @classmethod
    def build(
        cls, change: Change, payload: bytes, *, source_name: str, db: str, key_columns: Sequence[str], announced: object
    ) -> InsertTemplate | None:
        """The template of the table `change` (an INSERT parsed from `payload`) belongs to, or
        None when its document does not have the expected shape."""
        cols = change.raw_columns
        parts = payload.split(SPLIT)
        if change.action != "I" or not cols or len(parts) != len(cols) + 1 or not parts[0].startswith(_INSERT):
            return None
        ends = []
        for i, piece in enumerate(parts[1:]):
            end = _piece_end(piece, last=i == len(cols) - 1)
            if end is None:
                return None
            ends.append(end)
        names = [c["name"] for c in cols]
        keys = change.pk or tuple(key_columns)
        if len(set(names)) != len(names) or not set(keys) <= set(names):
            return None
        head = env._source_json(source_name, db, change.schema, change.table, 0, None, None)
        return cls(
            topic=topic_name(source_name, change.schema, change.table),
            tag=table_tag(parts[0]),
            ends=ends,
            types=[c["type"] for c in cols],
            names=names,
            key_columns=keys,
            source_head=head[: head.rindex(b'"lsn":') + 6],
            announced=announced,
        )

    @staticmethod
    def tx_part(tx_id: int | None, commit_ts_ms: int | None) -> bytes:
        """`,"txId":…,"ts_ms":…,"snapshot":"false"}`: the same for every change of a transaction."""
        return b',"txId":%b,"ts_ms":%b,"snapshot":"false"}' % (
            _NULL if tx_id is None else b"%d" % tx_id,
            _NULL if commit_ts_ms is None else b"%d" % commit_ts_ms,
        )

    def encode(self, payload: bytes, parts: list[bytes], tx_part: bytes, now_ms: int) -> tuple[bytes, bytes] | None:
        """(key, value) of the INSERT `payload` split into `parts`, or None (take the generic path).
        The per-column work runs as C-level `map`s: check every constant end, cut every token."""
        if len(parts) != self._n or (self._escapes and b"\\u" in payload):
            return None
        pieces = parts[1:]
        if not all(map(bytes.endswith, pieces, self._ends)):
            return None
        toks: list[Any] = list(map(bytes.__getitem__, pieces, self._cuts))
        for i, rule in self._rules:
            tok = rule(toks[i])
            if tok is None:
                return None
            toks[i] = tok
        pre, _, lsn = parts[0][: -self._tag_len].rpartition(b'"')
        hi, slash, lo = lsn.partition(b"/")
        if not slash or not pre.endswith(_LSN) or not pre.startswith(_INSERT):
            return None
        key = self._key_fmt % tuple(map(toks.__getitem__, self._key_at))
        toks.append((int(hi, 16) << 32) | int(lo, 16))
        toks.append(tx_part)
        toks.append(now_ms)
        return key, self._value_fmt % tuple(toks)

    def encode_many(self, payloads: list[bytes], tx_part: bytes, now_ms: int) -> tuple[list[bytes], list[bytes]] | None:
        """`encode` for a run of this table's INSERTs: typed (capture/_hotpath.pyx) unless it is not
        sure, then `encode_many_python`, the reference. None: some change needs the one-by-one path."""
        c = compiled.encode_inserts
        if c is not None:
            got = c(self._spec, payloads, tx_part + b',"op":"c","ts_ms":%d}' % now_ms)
            if got is not None:
                return got
        return self.encode_many_python(payloads, tx_part, now_ms)

    def encode_many_python(
        self, payloads: list[bytes], tx_part: bytes, now_ms: int
    ) -> tuple[list[bytes], list[bytes]] | None:
        """`encode_many` in Python, column by column: every per-change step is a C-level `map`,
        no Python frame per change."""
        n = len(payloads)
        parts = list(map(bytes.split, payloads, repeat(SPLIT, n)))
        if any(map(self._n.__ne__, map(len, parts))):
            return None
        cols = list(zip(*parts, strict=True))
        toks: list[Any] = []
        for col, end, cut in zip(cols[1:], self._ends, self._cuts):  # noqa: B905 - lengths checked
            if not all(map(bytes.endswith, col, repeat(end))):
                return None
            toks.append(list(map(bytes.__getitem__, col, repeat(cut))))
        for i, rule in self._rules:
            column = _COLUMN_RULES.get(rule, partial(_each, rule))(toks[i])
            if column is None:
                return None
            toks[i] = column
        # Within one transaction every head is the same up to the LSN's text (action, xid,
        # timestamp): check that prefix once for all, then cut each LSN out with one slice.
        heads = cols[0]
        pre, quote, _ = heads[0][: -self._tag_len].rpartition(b'"')
        prefix = pre + quote
        if not quote or not pre.endswith(_LSN) or not pre.startswith(_INSERT):
            return None
        if not all(map(bytes.startswith, heads, repeat(prefix))):
            return None
        lsns = list(
            map(
                bytes.partition, map(bytes.__getitem__, heads, repeat(slice(len(prefix), -self._tag_len))), repeat(b"/")
            )
        )
        if any(map(b"/".__ne__, map(_MIDDLE, lsns))):
            return None
        his = map(int, map(_FIRST, lsns), repeat(16))
        los = map(int, map(_LAST, lsns), repeat(16))
        key_cols = [toks[i] for i in self._key_at]
        keys = list(map(self._key_fmt.__mod__, zip(*key_cols, strict=True)))
        values = list(
            map(
                self._value_fmt.__mod__,
                zip(
                    *toks,
                    map(or_, map(lshift, his, repeat(32)), los),
                    repeat(tx_part, n),
                    repeat(now_ms, n),
                    strict=True,
                ),
            )
        )
        return keys, values


_FIRST = itemgetter(0)
_MIDDLE = itemgetter(1)
_LAST = itemgetter(2)


def _fmt_name(name: str) -> bytes:
    """`"name":%b` for a %-format: the name as orjson writes a dict key."""
    return orjson.dumps(name).replace(b"%", b"%%") + b":%b"


def _piece_end(piece: bytes, *, last: bool) -> bytes | None:
    """The constant end of a piece `VALUE},{"name":…,"typeoid":N` (or `VALUE}],"pk":[…]}` for the
    last column), found from the structure after the value: the value token itself is unknown."""
    if not last:
        at = piece.rfind(b'},{"name":')
    else:
        at = piece.rfind(b'}],"pk":')
        if at < 0 and piece.endswith(b"}]}"):
            at = len(piece) - 3  # no primary key: wal2json leaves "pk" out
        if not piece.endswith(b"}"):
            return None
    return piece[at:] if at > 0 else None
