"""capture/_speedups.c: compiled twins of the streamed-INSERT hot path; None = take the reference."""

from collections.abc import Sequence

def encode_inserts(
    spec: tuple[object, ...], payloads: list[bytes], value_tail: bytes
) -> tuple[list[bytes], list[bytes]] | None:
    """`InsertTemplate.encode_many_python`'s (keys, values) from the template's `spec`, or None."""

def encode_plain(
    first_offset: int, timestamp_ms: int, keys: Sequence[bytes], values: Sequence[bytes]
) -> tuple[bytes, list[int]] | None:
    """`codec.encode_plain_python`'s (lines, sizes), or None."""
