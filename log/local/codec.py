"""Segment line format, pure: one JSON object per line, raw key/value bytes spliced in, CRC last.

    {"offset":5,"timestamp":1700000000000,"lens":[8,120,4],"key":{"id":1},"value":{..},"headers":null,"crc":123}

`lens` are the byte lengths of the key, value and headers JSON, so a reader slices them out without
parsing them (values keep their exact bytes); `crc` is zlib.crc32 of everything before `,"crc":`.
A JSON `null` key/value/headers reads back as None (a null value is a tombstone).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Sequence
from itertools import chain, repeat
from operator import add as _add

import orjson

from tributary.log.local._twins import typed_twin

_typed_plain: Callable[[int, int, Sequence[bytes], Sequence[bytes]], tuple[bytes, list[int]] | None] | None
_typed_plain = typed_twin("encode_plain")  # tributary/impl.py warns when the build is missing

__all__ = [
    "BadLine",
    "Decoded",
    "RecordIn",
    "decode_line",
    "encode_batch",
    "encode_plain",
    "encode_plain_python",
    "peek_offset",
]

RecordIn = tuple[bytes | None, bytes | None, int, bytes | None]
"""(key, value, timestamp_ms, headers) as given to `append`."""
Decoded = tuple[int, int, bytes | None, bytes | None, bytes | None]
"""(offset, timestamp, key, value, headers) as read back."""

_NULL = b"null"
_HEAD = re.compile(rb'\{"offset":(\d+),"timestamp":(-?\d+),"lens":\[(\d+),(\d+),(\d+)\],"key":')
_OFFSET = re.compile(rb'\{"offset":(\d+),')
_crc32 = zlib.crc32
_SEP = b"\x00"  # cannot occur in JSON text: separates the batch-formatted line bodies
_BODY = b'{"offset":%d,"timestamp":%d,"lens":[%d,%d,%d],"key":%b,"value":%b,"headers":%b\x00'
_LINE = b'%b,"crc":%d}\n'
_TRAILER = 9


class BadLine(ValueError):
    """A line that is not an intact record; `offset` is set when the header could be read."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message)
        self.offset = offset


def _one_line(raw: bytes | None) -> bytes | None:
    """JSON with a newline in it (pretty-printed input) is re-encoded compactly."""
    if raw is None or b"\n" not in raw:
        return raw
    try:
        return orjson.dumps(orjson.loads(raw))
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"record field is not valid JSON: {exc}") from exc


def _nulls(fields: tuple[bytes | None, ...], n: int) -> tuple[bytes, ...]:
    nones = fields.count(None)
    if nones == 0:
        return fields  # type: ignore[return-value]  # no None in it (counted): tuple[bytes, ...]
    if nones == n:
        return (_NULL,) * n
    return tuple(_NULL if f is None else f for f in fields)


def encode_batch(first_offset: int, records: Sequence[RecordIn]) -> tuple[bytes, list[int], tuple[int, ...]]:
    """Encode records as consecutive lines from `first_offset`.

    Returns the bytes, each line's size and each record's timestamp. The per-record work is
    done by C-level `%`-formatting, `map` and `zip` over the whole batch (no Python loop):
    this is the writer's hot path."""
    n = len(records)
    if n == 0:
        return b"", [], ()
    ks, vs, tss, hs = zip(*records, strict=True)
    ks, vs, hs = _nulls(ks, n), _nulls(vs, n), _nulls(hs, n)
    args = tuple(
        chain.from_iterable(
            zip(
                range(first_offset, first_offset + n),
                tss,
                map(len, ks),
                map(len, vs),
                map(len, hs),
                ks,
                vs,
                hs,
                strict=True,
            )
        )
    )
    bodies = ((_BODY * n) % args).split(_SEP)
    bodies.pop()
    if len(bodies) != n:  # a NUL byte inside a field (not valid JSON): encode one by one
        bodies = [_BODY[:-1] % args[i * 8 : i * 8 + 8] for i in range(n)]
    crcs = list(map(_crc32, bodies))
    data = (_LINE * n) % tuple(chain.from_iterable(zip(bodies, crcs, strict=True)))
    if data.count(b"\n") != n:
        clean = [(_one_line(k), _one_line(v), ts, _one_line(h)) for k, v, ts, h in records]
        return encode_batch(first_offset, clean)
    # a line is its body + `,"crc":` + the CRC's digits + `}\n`
    sizes = list(map(_TRAILER.__add__, map(_add, map(len, bodies), map(len, map(str, crcs)))))
    return data, sizes, tss


def encode_plain(
    first_offset: int, timestamp_ms: int, keys: Sequence[bytes], values: Sequence[bytes]
) -> tuple[bytes, list[int]]:
    """`encode_batch`'s lines and sizes for records with one timestamp, no headers and no null key
    or value (a run of streamed INSERTs): typed (log/local/_typed.pyx) unless it is not sure (a
    NUL or a newline in a field), then `encode_plain_python`, the reference."""
    if _typed_plain is not None:
        got = _typed_plain(first_offset, timestamp_ms, keys, values)
        if got is not None:
            return got
    return encode_plain_python(first_offset, timestamp_ms, keys, values)


def encode_plain_python(
    first_offset: int, timestamp_ms: int, keys: Sequence[bytes], values: Sequence[bytes]
) -> tuple[bytes, list[int]]:
    """`encode_plain` in Python: three columns fewer than `encode_batch` to interleave per record,
    the same C-level `%`-formatting, `map` and `zlib.crc32` over the whole run."""
    n = len(keys)
    if n == 0:
        return b"", []
    body = b'{"offset":%%d,"timestamp":%d,"lens":[%%d,%%d,4],"key":%%b,"value":%%b,"headers":null\x00' % timestamp_ms
    args = tuple(
        chain.from_iterable(
            zip(range(first_offset, first_offset + n), map(len, keys), map(len, values), keys, values, strict=True)
        )
    )
    bodies = ((body * n) % args).split(_SEP)
    bodies.pop()
    if len(bodies) == n:
        crcs = list(map(_crc32, bodies))
        data = (_LINE * n) % tuple(chain.from_iterable(zip(bodies, crcs, strict=True)))
        if data.count(b"\n") == n:
            return data, list(map(_TRAILER.__add__, map(_add, map(len, bodies), map(len, map(str, crcs)))))
    # a NUL or a newline inside a field: the general encoder deals with those
    data, sizes, _ = encode_batch(first_offset, list(zip(keys, values, repeat(timestamp_ms), repeat(None))))
    return data, sizes


def decode_line(line: bytes) -> Decoded:
    """Decode one line (without its newline), checking structure and CRC; raises BadLine."""
    m = _HEAD.match(line)
    if m is None:
        om = _OFFSET.match(line)
        raise BadLine("undecodable record header", int(om.group(1)) if om else None)
    off = int(m.group(1))
    kl = int(m.group(3))
    vl = int(m.group(4))
    hl = int(m.group(5))
    p = m.end()
    k = line[p : p + kl]
    p += kl
    if line[p : p + 9] != b',"value":':
        raise BadLine("record fields do not match their lengths", off)
    p += 9
    v = line[p : p + vl]
    p += vl
    if line[p : p + 11] != b',"headers":':
        raise BadLine("record fields do not match their lengths", off)
    p += 11
    h = line[p : p + hl]
    p += hl
    if line[p : p + 7] != b',"crc":' or line[-1:] != b"}":
        raise BadLine("record has no CRC trailer", off)
    try:
        crc = int(line[p + 7 : -1])
    except ValueError:
        raise BadLine("record CRC is not a number", off) from None
    if _crc32(line[:p]) != crc:
        raise BadLine("CRC mismatch", off)
    return (
        off,
        int(m.group(2)),
        None if k == _NULL else k,
        None if v == _NULL else v,
        None if h == _NULL else h,
    )


def peek_offset(line: bytes) -> int | None:
    """The offset a line claims, without checking it (for index validation)."""
    m = _OFFSET.match(line)
    return int(m.group(1)) if m else None
