"""Sparse indexes, pure: fixed-width big-endian entries, looked up by bisection.

Offset index entry: (relative offset u32, byte position u32) — the record at that position.
Time index entry: (max timestamp i64, relative offset u32) — every record *before* that offset
has a timestamp <= the max (the last entry of a sealed segment covers the whole segment).
"""

from __future__ import annotations

import bisect
import struct

__all__ = [
    "OFFSET_ENTRY",
    "TIME_ENTRY",
    "lookup_offset",
    "lookup_time",
    "pack_offsets",
    "pack_times",
    "unpack_offsets",
    "unpack_times",
]

_OFF = struct.Struct(">II")
_TIME = struct.Struct(">qI")
OFFSET_ENTRY = _OFF.size
TIME_ENTRY = _TIME.size


def pack_offsets(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(_OFF.pack(rel, pos) for rel, pos in entries)


def unpack_offsets(data: bytes) -> list[tuple[int, int]]:
    """Entries in file order; a torn trailing partial entry is ignored."""
    usable = len(data) - len(data) % OFFSET_ENTRY
    return list(_OFF.iter_unpack(data[:usable]))


def pack_times(entries: list[tuple[int, int]]) -> bytes:
    return b"".join(_TIME.pack(ts, rel) for ts, rel in entries)


def unpack_times(data: bytes) -> list[tuple[int, int]]:
    usable = len(data) - len(data) % TIME_ENTRY
    return list(_TIME.iter_unpack(data[:usable]))


def lookup_offset(entries: list[tuple[int, int]], rel: int) -> tuple[int, int]:
    """The last entry at or before `rel` (or (0, 0), the segment start)."""
    i = bisect.bisect_right(entries, (rel, 1 << 62)) - 1
    return entries[i] if i >= 0 else (0, 0)


def lookup_time(entries: list[tuple[int, int]], ts: int) -> int:
    """Relative offset from which to scan for the first record with timestamp >= ts."""
    start = 0
    for max_ts, rel in entries:
        if max_ts < ts:
            start = rel
        else:
            break
    return start
