"""capture/_speedups.c: compiled twins of the streamed-INSERT and snapshot hot paths; None = take the reference."""

from collections.abc import Callable, Sequence
from typing import Any

def encode_inserts(
    spec: tuple[object, ...], payloads: list[bytes], value_tail: bytes
) -> tuple[list[bytes], list[bytes]] | None:
    """`InsertTemplate.encode_many_python`'s (keys, values) from the template's `spec`, or None."""

def encode_plain(
    first_offset: int, timestamp_ms: int, keys: Sequence[bytes], values: Sequence[bytes]
) -> tuple[bytes, list[int]] | None:
    """`codec.encode_plain_python`'s (lines, sizes), or None."""

def encode_columns(
    first_offset: int, timestamp_ms: int, n: int, pieces: Sequence[bytes | tuple[Any, Any, int, Any]]
) -> tuple[bytes, list[int]] | None:
    """`codec_arrow.encode_columns_python`'s (lines, sizes) for n records, or None: pieces[0] is
    the key, the rest the value; each is bytes (every record's) or an Arrow binary array's
    (offsets buffer, data buffer, array offset, None or n int64 row numbers to take)."""

def split_partitions(
    keys: list[bytes], values: list[bytes], partitions: int
) -> list[tuple[list[bytes], list[bytes]]] | None:
    """`partitioner.split_partitions_python`'s per-partition (keys, values), or None."""

def column_partitions(offsets: Any, data: Any, start: int, out: Any, partitions: int) -> bool | None:
    """`snapshot_columns.murmur2_partitions_python` of an Arrow binary array (int32 offsets,
    data, the array's offset) into the int64 buffer `out`: True, or None (not sure)."""

def risky_bytes(data: Any) -> bool:
    """`snapshot_columns.risky_bytes_python`: a byte below 0x20, or the two bytes `\\v`?"""

def take_copy(get_copy_data: Callable[[int], tuple[int, Any]], buf: bytearray, limit: int) -> int:
    """`snapshot.take_copy_python`: COPY rows onto `buf` until it holds `limit` bytes (1), or the
    first n <= 0 get_copy_data answers."""

def take_inserts(
    get_copy_data: Callable[[int], tuple[int, Any]], run: list[bytes], room: int
) -> tuple[int, Any] | None:
    """Held INSERT payloads from libpq onto `run` (at most `room`); the first other message's
    (n, data) untouched, or None (took `room`, or nothing is buffered)."""
