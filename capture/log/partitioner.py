"""Key → partition, the way Kafka's default partitioner does it (murmur2, positive, mod n).

Pure and deterministic across processes: never Python's salted `hash`. The hash runs in compiled
code (the `murmurhash2` package: ≈0.3 µs a key instead of ≈2 µs, a tenth of capture's per-change
time) where its wheel is installed; the Python version below is the reference and the fallback,
and the tests hold both to Kafka's own vectors.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from itertools import compress, repeat
from operator import and_, mod
from typing import Any

import orjson

from tributary.capture import compiled

_compiled_murmur2: Callable[[bytes, int], int] | None
try:
    from murmurhash2 import murmurhash2 as _compiled_murmur2
except ImportError:  # no wheel for this platform: the pure-Python hash gives the same answers
    _compiled_murmur2 = None

__all__ = [
    "canonical_json",
    "murmur2",
    "murmur2_python",
    "partition_for",
    "partitions_for",
    "split_partitions",
    "split_partitions_python",
]

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF
_WORDS = struct.unpack_from


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2`: a signed 32-bit int, as the Java client returns it."""
    if _compiled_murmur2 is None:
        return murmur2_python(data)
    h = _compiled_murmur2(data, _SEED)
    return h - (1 << 32) if h & 0x80000000 else h


def murmur2_python(data: bytes) -> int:
    """`murmur2` in pure Python (the reference)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    end4 = length & ~3
    for k in _WORDS(f"<{end4 >> 2}I", data) if end4 else ():  # all 4-byte words in one C call
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[end4 + 2] << 16
    if rest >= 2:
        h ^= data[end4 + 1] << 8
    if rest >= 1:
        h ^= data[end4]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes | None, partitions: int) -> int:
    """Kafka's `toPositive(murmur2(key)) % n`; a None key goes to partition 0."""
    if partitions <= 0:
        raise ValueError(f"partitions must be positive, got {partitions}")
    if key is None:
        return 0
    if _compiled_murmur2 is not None:  # unsigned, but the low 31 bits are the same
        return (_compiled_murmur2(key, _SEED) & 0x7FFFFFFF) % partitions
    return (murmur2_python(key) & 0x7FFFFFFF) % partitions


def partitions_for(keys: Sequence[bytes], partitions: int) -> list[int]:
    """`partition_for` of each key (none None), as C-level maps when the compiled hash is there."""
    if partitions <= 0:
        raise ValueError(f"partitions must be positive, got {partitions}")
    if _compiled_murmur2 is None:
        return [partition_for(k, partitions) for k in keys]
    hashes = map(_compiled_murmur2, keys, repeat(_SEED))
    return list(map(mod, map(and_, hashes, repeat(0x7FFFFFFF)), repeat(partitions)))


def split_partitions(keys: list[bytes], values: list[bytes], partitions: int) -> list[tuple[list[bytes], list[bytes]]]:
    """Each partition's keys and values, in their order (`partition_for` of each key): in C
    (capture/_speedups.c) unless it declines, then `split_partitions_python`, the reference."""
    c = compiled.split_partitions
    if c is not None:
        got = c(keys, values, partitions)
        if got is not None:
            return got
    return split_partitions_python(keys, values, partitions)


def split_partitions_python(
    keys: list[bytes], values: list[bytes], partitions: int
) -> list[tuple[list[bytes], list[bytes]]]:
    """`split_partitions` in Python: C-level `compress` per partition."""
    if len(keys) != len(values):
        raise ValueError("as many keys as values")
    where = partitions_for(keys, partitions)
    out = []
    for partition in range(partitions):
        mine = list(map(partition.__eq__, where))
        out.append((list(compress(keys, mine)), list(compress(values, mine))))
    return out


def canonical_json(obj: Any) -> bytes:
    """The key's canonical bytes: sorted keys, no whitespace (what the partition hash is over)."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
