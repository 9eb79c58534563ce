"""capture/_hotpath.pyx: typed twins of the streamed-INSERT and COPY loops; None = take the reference."""

from collections.abc import Callable
from typing import Any

def take_inserts(
    get_copy_data: Callable[[int], tuple[int, Any]], run: list[bytes], room: int
) -> tuple[int, Any] | None:
    """Held INSERT payloads from libpq onto `run` (at most `room`); the first other message's
    (n, data) untouched, or None (took `room`, or nothing is buffered)."""

def encode_inserts(
    spec: tuple[object, ...], payloads: list[bytes], value_tail: bytes
) -> tuple[list[bytes], list[bytes]] | None:
    """`InsertTemplate.encode_many_python`'s (keys, values) from the template's `spec`, or None."""

def take_copy(get_copy_data: Callable[[int], tuple[int, Any]], buf: bytearray, limit: int) -> int:
    """`snapshot.reader.take_copy_python`: COPY rows onto `buf` until it holds `limit` bytes (1), or the
    first n <= 0 get_copy_data answers."""
