"""Segment lines (codec.py's format) for a whole column of records at once, with pyarrow.

`codec.encode_batch` formats record by record in C-level `%` but still builds eight Python
objects a record. The reference, `encode_columns_python`, joins the offsets, lengths, key and value
pieces with one vectorised kernel, runs zlib's CRC over slices of that one buffer, and adds the
trailer with a second join; `encode_columns` hands the columns' Arrow buffers to the typed twin
(log/local/_typed.pyx) and runs the reference when it is missing or answers None. The bytes equal `encode_batch`'s for the same records (tests hold them equal).
Imported only by the columnar snapshot: pyarrow stays out of the CLI.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tributary.log.local._twins import typed_twin

_typed_columns: Callable[[int, int, int, list[Any]], tuple[bytes, list[int]] | None] | None
_typed_columns = typed_twin("encode_columns")

__all__ = ["encode_columns", "encode_columns_python"]

_EMPTY = pa.scalar(b"", pa.binary())
_BINARY = pa.binary()
_NO_DATA = pa.py_buffer(b"")


def _digits(values: np.ndarray) -> pa.Array:
    return pa.array(values).cast(pa.string()).view(pa.binary())


def _lengths(arg: pa.Array | pa.Scalar, n: int) -> np.ndarray:
    if isinstance(arg, pa.Scalar):
        return np.full(n, len(arg.as_py()), np.int64)
    lengths = pc.binary_length(arg)  # int32, no nulls; (`to_numpy` would import pandas)
    return np.frombuffer(lengths.buffers()[1], np.int32, n, lengths.offset * 4).astype(np.int64)


def _piece(arg: pa.Array | pa.Scalar, n: int) -> bytes | tuple[Any, Any, int] | None:
    """A piece for the typed `encode_columns`: a scalar's bytes, or a binary array's (offsets,
    data, offset); None for anything else (the reference runs)."""
    if isinstance(arg, pa.Scalar):
        data = arg.as_py() if arg.type == _BINARY and arg.is_valid else None
        return data if isinstance(data, bytes) else None
    if not isinstance(arg, pa.Array) or arg.type != _BINARY or arg.null_count or len(arg) != n:
        return None
    _validity, offsets, data = arg.buffers()
    return (offsets, _NO_DATA if data is None else data, arg.offset)


def encode_columns(
    first_offset: int, timestamp_ms: int, keys: pa.Array, value_args: Sequence[pa.Array | pa.Scalar]
) -> tuple[bytes, list[int]]:
    """`encode_columns_python`'s lines and sizes, by the typed twin (log/local/_typed.pyx) when
    it is sure: the finished lines in one pass over the columns' buffers, CRC included."""
    if _typed_columns is not None:
        n = len(keys)
        pieces: list[Any] = []
        for arg in (keys, *value_args):
            piece = _piece(arg, n)
            if piece is None:
                break
            pieces.append(piece)
        else:
            out = _typed_columns(first_offset, timestamp_ms, n, pieces)
            if out is not None:
                return out
    return encode_columns_python(first_offset, timestamp_ms, keys, value_args)


def encode_columns_python(
    first_offset: int, timestamp_ms: int, keys: pa.Array, value_args: Sequence[pa.Array | pa.Scalar]
) -> tuple[bytes, list[int]]:
    """Lines for records (key, the concatenation of `value_args`, `timestamp_ms`, headers null)
    from `first_offset`; returns the bytes and each line's size. Keys and value pieces are
    binary arrays (or scalars, the same for every record) without nulls, compact JSON text: no
    newline inside (`encode_batch` would re-encode such a record; this never sees one)."""
    n = len(keys)
    if n == 0:
        return b"", []
    vlen = sum((_lengths(a, n) for a in value_args), np.zeros(n, np.int64))
    klen = _lengths(keys, n)
    body = pc.binary_join_element_wise(
        pa.scalar(b'{"offset":', pa.binary()),
        _digits(np.arange(first_offset, first_offset + n, dtype=np.int64)),
        pa.scalar(b',"timestamp":%d,"lens":[' % timestamp_ms, pa.binary()),
        _digits(klen),
        pa.scalar(b",", pa.binary()),
        _digits(vlen),
        pa.scalar(b',4],"key":', pa.binary()),
        keys,
        pa.scalar(b',"value":', pa.binary()),
        *value_args,
        pa.scalar(b',"headers":null', pa.binary()),
        _EMPTY,
    )
    offsets = np.frombuffer(body.buffers()[1], np.int32, n + 1, body.offset * 4)
    view = memoryview(body.buffers()[2])
    crcs = np.fromiter(
        map(zlib.crc32, map(view.__getitem__, map(slice, offsets[:-1].tolist(), offsets[1:].tolist()))),
        np.int64,
        n,
    )
    lines = pc.binary_join_element_wise(
        body, pa.scalar(b',"crc":', pa.binary()), _digits(crcs), pa.scalar(b"}\n", pa.binary()), _EMPTY
    )
    line_offsets = np.frombuffer(lines.buffers()[1], np.int32, n + 1, lines.offset * 4)
    start, end = int(line_offsets[0]), int(line_offsets[-1])
    data = lines.buffers()[2].slice(start, end - start).to_pybytes()
    return data, np.diff(line_offsets).tolist()
