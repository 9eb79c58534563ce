"""The columnar snapshot: chunks of `COPY … TO STDOUT` text → key and envelope bytes, per column. Pure.

A snapshot row's record is mostly the same for every row of a table (the `source` block, the
column names); what differs is each column's JSON fragment. PostgreSQL's COPY text is already
nearly JSON string content (COPY escapes `\\`, `\\n`, `\\t`, `\\r`, `\\b`, `\\f` exactly as JSON
does), so a chunk of rows is parsed into Arrow columns and every fragment is made by vectorised
pyarrow compute instead of a Python loop per value: a few passes over the chunk's bytes rather
than Python code per row. The bytes equal what `SnapshotEncoder.encode` makes from the same
row (tests hold the two paths equal against the real server): anything a vector kernel could
spell differently — raw control characters, COPY's `\\v`, a non-hex bytea — is converted by
the reference (unescape, `capture.values`, orjson) for those values only.

Types with no exact vector spelling (json/jsonb: kept verbatim with their whitespace; floats:
shortest-repr differs; arrays: element conversion) make `plan` return None: such a table keeps
the other snapshot paths (docs/capture.md).
"""

from __future__ import annotations

import importlib.abc
import io
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import orjson

# pyarrow imports pandas (a noticeable share of the CPU of a small
# snapshot) the first time it checks whether an argument is a pandas object. Hidden while that
# first check runs, pandas stays unloaded; pyarrow imports it again if a conversion ever asks.


class _NoPandas(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "pandas":
            raise ImportError("hidden while pyarrow first looks for it")


_finder = _NoPandas() if "pandas" not in sys.modules else None
if _finder is not None:
    sys.meta_path.insert(0, _finder)
try:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    pa.scalar(b"", pa.binary())  # pyarrow's pandas check, now
finally:
    if _finder is not None:
        sys.meta_path.remove(_finder)

from tributary.capture.decoding.values import TextConverter, copy_unescape, text_converter, type_family  # noqa: E402
from tributary.log import hashes  # noqa: E402

__all__ = ["ChunkRecords", "ColumnPlan", "encode_chunk", "murmur2_partitions", "plan"]

_STRING_FAMILIES = ("text", "numeric", "tstz", "ts", "bytea")
# What a vector kernel would spell unlike orjson: raw control characters COPY leaves unescaped
# (orjson writes \u00XX), COPY's `\v` (orjson: \u000b); a doubled backslash before `v` also
# matches, harmlessly (the reference path handles it too).
_RISKY_VALUE = r"[\x01-\x07\x0e-\x1f]|\\v"
_NULL = pa.scalar(b"null", pa.binary())
_EMPTY = pa.scalar(b"", pa.binary())
_QUOTE = pa.scalar(b'"', pa.binary())
_DUMMY = b"-\n"  # a first line for the CSV reader to skip: it would strip a BOM from the data's start


def _b(data: bytes) -> pa.Scalar:
    return pa.scalar(data, pa.binary())


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """What is the same for every chunk of one table: column families and the fixed JSON text."""

    names: tuple[str, ...]
    families: tuple[str, ...]
    converters: tuple[TextConverter, ...]  # capture.values.text_converter per column (the reference)
    key_index: tuple[int, ...]  # key columns, in canonical (sorted) order
    key_heads: tuple[bytes, ...]  # `{"k":` then `,"k2":` …
    after_heads: tuple[bytes, ...]  # `{"before":null,"after":{"c":` then `,"c2":` …


def plan(columns: Sequence[tuple[str, str]], key: Sequence[str]) -> ColumnPlan | None:
    """The table's plan, or None when a column type (json, float, array) or the key rules it out."""
    names = tuple(name for name, _ in columns)
    families = tuple(type_family(type_name) for _, type_name in columns)
    if not names or not key or not set(key) <= set(names):
        return None
    if any(fam not in _STRING_FAMILIES and fam not in ("int", "bool") for fam in families):
        return None
    key_names = sorted(set(key))
    key_index = tuple(names.index(k) for k in key_names)
    key_heads = tuple((b"{" if i == 0 else b",") + orjson.dumps(k) + b":" for i, k in enumerate(key_names))
    after_heads = tuple(
        (b'{"before":null,"after":{' if i == 0 else b",") + orjson.dumps(n) + b":" for i, n in enumerate(names)
    )
    return ColumnPlan(
        names=names,
        families=families,
        converters=tuple(text_converter(type_name) for _, type_name in columns),
        key_index=key_index,
        key_heads=key_heads,
        after_heads=after_heads,
    )


def reference_fragment(converter: TextConverter, raw: bytes | None) -> bytes:
    """One value's JSON the way the row path spells it: COPY unescape, capture.values, orjson."""
    if raw is None or raw == b"\\N":
        return b"null"
    text = copy_unescape(raw).decode()
    return orjson.dumps(text if converter is None else converter(text))


def _iso(col: pa.Array, *, zone: bool) -> pa.Array:
    """capture.values._iso over a column: first space → T, a zero UTC offset → Z; infinities and
    BC dates unchanged."""
    special = pc.or_(
        pc.or_(pc.equal(col, _b(b"infinity")), pc.equal(col, _b(b"-infinity"))),
        pc.ends_with(col, pattern=" BC"),
    )
    out = pc.replace_substring(col, pattern=" ", replacement="T", max_replacements=1)
    if zone:
        z3 = pc.ends_with(out, pattern="+00")
        z6 = pc.ends_with(out, pattern="+00:00")
        out = pc.if_else(
            z3,
            pc.binary_join_element_wise(pc.binary_slice(out, 0, -3), _b(b"Z"), _EMPTY),
            pc.if_else(z6, pc.binary_join_element_wise(pc.binary_slice(out, 0, -6), _b(b"Z"), _EMPTY), out),
        )
    return pc.if_else(special, col, out)


def _fragment(col: pa.Array, family: str, converter: TextConverter, has_quote: bool) -> pa.Array:
    """One column's JSON fragments (NULL → null)."""
    if family == "int":
        return pc.fill_null(col, _NULL)
    if family == "bool":
        return pc.fill_null(pc.if_else(pc.equal(col, _b(b"t")), _b(b"true"), _b(b"false")), _NULL)
    risky: pa.Array | None = None
    text = col
    if family == "bytea":
        risky = pc.invert(pc.starts_with(col, pattern="\\\\x"))  # escape-format output: the reference
        text = pc.replace_substring(col, pattern="\\\\x", replacement="", max_replacements=1)  # (binary_slice
        # fails on values shorter than its start in pyarrow 26: "Negative buffer resize")
    elif family == "tstz" or family == "ts":
        text = _iso(col, zone=family == "tstz")
    if has_quote:
        text = pc.replace_substring(text, pattern='"', replacement='\\"')
    out = pc.fill_null(pc.binary_join_element_wise(_QUOTE, text, _QUOTE, _EMPTY), _NULL)
    if _has_risky_bytes(col):
        hit = pc.match_substring_regex(col.view(pa.string()), pattern=_RISKY_VALUE)
        risky = hit if risky is None else pc.or_(risky, hit)
    if risky is not None:
        risky = pc.fill_null(risky, False)
        hits = pc.indices_nonzero(risky)
        if len(hits):
            raws = col.take(hits).to_pylist()
            fixed = pa.array([reference_fragment(converter, r) for r in raws], pa.binary())
            out = pc.replace_with_mask(out, risky, fixed)
    return out


def _has_risky_bytes(col: pa.Array) -> bool:
    """Does any value hold a raw control character (COPY leaves them unescaped, orjson writes
    \\u00XX) or COPY's `\\v`? One pass over the column's bytes at C speed (numpy's min and
    a substring search) instead of a regex over every value."""
    offsets = np.frombuffer(col.buffers()[1], np.int32, len(col) + 1, col.offset * 4)
    start, end = int(offsets[0]), int(offsets[-1])
    if start == end:
        return False
    raw = col.buffers()[2].slice(start, end - start).to_pybytes()
    return b"\\v" in raw or int(np.frombuffer(raw, np.uint8).min()) < 0x20


def parse_chunk(chunk: bytes, width: int) -> list[pa.Array]:
    """COPY text lines (with `_DUMMY` first) → one binary column each, NULL for `\\N`."""
    names = [str(i) for i in range(width)]
    table = pcsv.read_csv(
        io.BytesIO(chunk),
        read_options=pcsv.ReadOptions(column_names=names, use_threads=False, block_size=1 << 30, skip_rows=1),
        parse_options=pcsv.ParseOptions(
            delimiter="\t", quote_char=False, escape_char=False, newlines_in_values=False, ignore_empty_lines=False
        ),
        convert_options=pcsv.ConvertOptions(
            column_types=dict.fromkeys(names, pa.binary()),
            null_values=["\\N"],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
        ),
    )
    return [c.combine_chunks() for c in table.columns]


@dataclass(slots=True)
class ChunkRecords:
    """One chunk's records: key bytes, the `after`-part fragments, and each row's partition."""

    keys: pa.Array
    fragments: list[pa.Array]
    partitions: np.ndarray
    rows: int


def encode_chunk(p: ColumnPlan, chunk: bytes, partitions: int) -> ChunkRecords:
    """Fragments, keys and partitions for a chunk (`_DUMMY` + COPY text lines)."""
    cols = parse_chunk(chunk, len(p.names))
    quote = b'"' in chunk
    frags = [_fragment(col, fam, conv, quote) for col, fam, conv in zip(cols, p.families, p.converters, strict=True)]
    key_args: list[pa.Array | pa.Scalar] = []
    for head, i in zip(p.key_heads, p.key_index, strict=True):
        key_args += [_b(head), frags[i]]
    keys = pc.binary_join_element_wise(*key_args, _b(b"}"), _EMPTY)
    n = len(cols[0])
    return ChunkRecords(keys=keys, fragments=frags, partitions=murmur2_partitions(keys, partitions), rows=n)


def murmur2_partitions(keys: pa.Array, partitions: int) -> np.ndarray:
    """Kafka's `toPositive(murmur2(key)) % n` for every key (int64): the log partitioner's hash,
    the positive mod over the whole array."""
    if partitions <= 0:
        raise ValueError(f"partitions must be positive, got {partitions}")
    h = np.fromiter(hashes(keys.to_pylist()), np.int64, len(keys))
    return (h & 0x7FFFFFFF) % partitions


def rows_of(partitions: np.ndarray, partition: int) -> np.ndarray:
    """The chunk's rows that go to `partition`, in their order."""
    return np.flatnonzero(partitions == partition)


def value_args(p: ColumnPlan, recs: ChunkRecords, rows: np.ndarray) -> list[pa.Array | pa.Scalar]:
    """The pieces whose concatenation is each row's value up to the end of `after`'s last column
    (`{"before":null,"after":{"c":1,"d":"x"`); the caller adds `}` and the `source` tail."""
    args: list[pa.Array | pa.Scalar] = []
    for head, frag in zip(p.after_heads, recs.fragments, strict=True):
        args += [_b(head), frag.take(rows)]
    return args


def scalar(data: bytes) -> pa.Scalar:
    return _b(data)


def last_tail(n: int, tail: bytes, last: bytes) -> pa.Array:
    """`tail` for every row but the last, which gets `last` (the snapshot's final record)."""
    return pa.array([tail] * (n - 1) + [last], pa.binary())
