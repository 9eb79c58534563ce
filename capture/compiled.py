"""The compiled hot path (capture/_speedups.c) if it was built, else None for each function.

Each compiled function is a twin of a pure-Python reference (`InsertTemplate.encode_many_python`,
`partitioner.split_partitions_python`, `codec.encode_plain_python`, `codec_arrow.encode_columns_python`,
`snapshot.take_copy_python`, `snapshot_columns.murmur2_partitions_python` and `risky_bytes_python`,
and for `take_inserts` the receive loop with `SourceSession.handle`) and answers None whenever it
is not sure of the reference's result; callers then run the reference. Missing (no compiler at install time): one
warning, then the references alone, slower. `TRIBUTARY_PURE_PYTHON=1` turns it off on purpose.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "column_partitions",
    "encode_columns",
    "encode_inserts",
    "encode_plain",
    "risky_bytes",
    "split_partitions",
    "take_copy",
    "take_inserts",
]

encode_inserts: Callable[[tuple[object, ...], list[bytes], bytes], tuple[list[bytes], list[bytes]] | None] | None
encode_plain: Callable[[int, int, Sequence[bytes], Sequence[bytes]], tuple[bytes, list[int]] | None] | None
encode_columns: (
    Callable[[int, int, int, Sequence[bytes | tuple[Any, Any, int, Any]]], tuple[bytes, list[int]] | None] | None
)
split_partitions: Callable[[list[bytes], list[bytes], int], list[tuple[list[bytes], list[bytes]]] | None] | None
column_partitions: Callable[[Any, Any, int, Any, int], bool | None] | None
risky_bytes: Callable[[Any], bool] | None
take_copy: Callable[[Callable[[int], tuple[int, Any]], bytearray, int], int] | None
take_inserts: Callable[[Callable[[int], tuple[int, Any]], list[bytes], int], tuple[int, Any] | None] | None

_OFF = os.environ.get("TRIBUTARY_PURE_PYTHON") == "1"
try:
    if _OFF:
        raise ImportError("TRIBUTARY_PURE_PYTHON=1")
    from tributary.capture._speedups import (
        column_partitions,
        encode_columns,
        encode_inserts,
        encode_plain,
        risky_bytes,
        split_partitions,
        take_copy,
        take_inserts,
    )
except ImportError as exc:  # not built (or turned off): the references give the same bytes, more slowly
    column_partitions = encode_columns = encode_inserts = encode_plain = risky_bytes = None
    split_partitions = take_copy = take_inserts = None
    if not _OFF:
        logging.getLogger(__name__).warning(
            "capture: the compiled hot path (capture._speedups) is not available (%s); using pure Python", exc
        )
