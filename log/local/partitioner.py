"""Key → partition, the way Kafka's default partitioner does it (murmur2, positive, mod n).

Pure and deterministic across processes: never Python's salted `hash`. The one murmur2 of the
project is the `murmurhash2` package's (a maintained compiled wheel, a dependency); the tests hold
it to Kafka's own vectors. The columnar snapshot partitions its keys through `partitions_for` too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import compress, repeat
from operator import and_, mod

import orjson
from murmurhash2 import murmurhash2

from tributary.log.local._twins import typed_twin

_typed_split: Callable[[list[bytes], list[bytes], int], list[tuple[list[bytes], list[bytes]]]] | None
_typed_split = typed_twin("split_partitions")  # hashes with the same murmurhash2

__all__ = [
    "canonical_json",
    "hashes",
    "murmur2",
    "partition_for",
    "partitions_for",
    "split_partitions",
    "split_partitions_python",
]

_SEED = 0x9747B28C
_POSITIVE = 0x7FFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2`: a signed 32-bit int, as the Java client returns it."""
    h: int = murmurhash2(data, _SEED)
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes | None, partitions: int) -> int:
    """Kafka's `toPositive(murmur2(key)) % n`; a None key goes to partition 0."""
    if partitions <= 0:
        raise ValueError(f"partitions must be positive, got {partitions}")
    if key is None:
        return 0
    return (murmurhash2(key, _SEED) & _POSITIVE) % partitions  # unsigned, but the low 31 bits are the same


def hashes(keys: Iterable[bytes]) -> Iterator[int]:
    """Kafka's murmur2 of each key as an unsigned 32-bit int (its low 31 bits are `toPositive`'s),
    lazily, as one C-level `map`: for callers that take the positive mod over an array at once."""
    return map(murmurhash2, keys, repeat(_SEED))


def partitions_for(keys: Iterable[bytes], partitions: int) -> list[int]:
    """`partition_for` of each key (none None), as C-level maps: no Python frame per key."""
    if partitions <= 0:
        raise ValueError(f"partitions must be positive, got {partitions}")
    return list(map(mod, map(and_, hashes(keys), repeat(_POSITIVE)), repeat(partitions)))


def split_partitions(keys: list[bytes], values: list[bytes], partitions: int) -> list[tuple[list[bytes], list[bytes]]]:
    """Each partition's keys and values, in their order (`partition_for` of each key): typed
    (log/local/_typed.pyx) for lists of bytes, else `split_partitions_python`, the reference."""
    if _typed_split is not None and type(keys) is list and type(values) is list and 0 < partitions <= _POSITIVE:
        return _typed_split(keys, values, partitions)
    return split_partitions_python(keys, values, partitions)


def split_partitions_python(
    keys: list[bytes], values: list[bytes], partitions: int
) -> list[tuple[list[bytes], list[bytes]]]:
    """`split_partitions` in Python: one C-level `compress` per partition."""
    if len(keys) != len(values):
        raise ValueError("as many keys as values")
    where = partitions_for(keys, partitions)
    if partitions == 1:
        return [(list(keys), list(values))]
    out = []
    for partition in range(partitions):
        mine = list(map(partition.__eq__, where))
        out.append((list(compress(keys, mine)), list(compress(values, mine))))
    return out


def canonical_json(obj: object) -> bytes:
    """The key's canonical bytes: sorted keys, no whitespace (what the partition hash is over)."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
