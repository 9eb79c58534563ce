"""log/local/_typed.pyx: typed twins of the log's per-record steps; None = take the reference."""

from collections.abc import Sequence
from typing import Any

def encode_plain(
    first_offset: int, timestamp_ms: int, keys: Sequence[bytes], values: Sequence[bytes]
) -> tuple[bytes, list[int]] | None:
    """`codec.encode_plain_python`'s (lines, sizes), or None."""

def split_partitions(keys: list[bytes], values: list[bytes], partitions: int) -> list[tuple[list[bytes], list[bytes]]]:
    """`partitioner.split_partitions_python`'s per-partition (keys, values)."""

def encode_columns(
    first_offset: int, timestamp_ms: int, n: int, pieces: list[bytes | tuple[Any, Any, int]]
) -> tuple[bytes, list[int]] | None:
    """`codec_arrow.encode_columns_python`'s (lines, sizes) for n records, or None: pieces[0] is
    the key, the rest the value; each is bytes (every record's) or an Arrow binary array's
    (offsets buffer, data buffer, array offset)."""

def key_spans(data: bytes, offs: Any, ks: Any, ke: Any, tomb: Any) -> int:
    """Each line's offset, key span and tombstone flag into the int64/int64/int64/uint8 arrays; the line
    count, or -1 (not intact, or more lines than the arrays hold): take the decoding path."""
