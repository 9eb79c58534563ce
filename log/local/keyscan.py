"""A topic's live keys read from its segments' bytes (keys.py says how), with numpy and Arrow
over whole splits and partitions, not key by key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tributary.log.local._twins import typed_twin
from tributary.log.local.columnar import decode_split, read_split_columns
from tributary.log.local.keys import SCHEMA_KEY
from tributary.log.local.splits import read_split
from tributary.log.local.types import Split

__all__ = ["gather", "latest_live", "live_key_array_in", "live_keys_in", "split_keys"]

_SHORTEST_LINE = len(b'{"offset":0,"timestamp":0,"lens":[0,0,0],"key":,"value":,"headers":,"crc":0}\n')
_key_spans: Callable[..., int] | None = typed_twin("key_spans")


def live_keys_in(splits: Sequence[Split], ends: Sequence[int]) -> set[bytes]:
    """The live keys of one topic's `splits` (each partition's in offset order) up to `ends`
    (committed end per partition), as a set: a bytes object and a set slot per key (docs/capture.md
    says how much)."""
    return set(live_key_array_in(splits, ends).to_pylist())


def live_key_array_in(splits: Sequence[Split], ends: Sequence[int]) -> pa.Array:
    """The live keys of one topic's `splits` (each partition's in offset order) up to `ends`
    (committed end per partition) as one Arrow binary array (no Python object per key): each
    partition folded whole by `latest_live` (a key lives in one partition)."""
    by_partition: dict[int, list[tuple[pa.Array, np.ndarray]]] = {}
    for split in splits:
        by_partition.setdefault(split.partition, []).append(split_keys(split, ends[split.partition]))
    parts = []
    for pieces in by_partition.values():
        keys = pa.concat_arrays([k for k, _ in pieces])
        tomb = np.concatenate([t for _, t in pieces])
        parts.append(latest_live(keys, tomb))
    return pa.concat_arrays(parts) if parts else pa.array([], pa.binary())


def latest_live(keys: pa.Array, tomb: np.ndarray) -> pa.Array:
    """The keys (in record order, binary, no nulls) whose last record is not a tombstone: one
    hash aggregation (Arrow's ordered `last`, single-threaded so that order holds)."""
    if len(keys) == 0:
        return keys
    last = pa.table({"key": keys, "tomb": tomb}).group_by("key", use_threads=False).aggregate([("tomb", "last")])
    return last.filter(pc.invert(last["tomb_last"]))["key"].combine_chunks()


def split_keys(split: Split, hi: int) -> tuple[pa.Array, np.ndarray]:
    """The keys (binary; keyless and schema records left out) of the split's records with offsets
    below `hi`, and per key whether its record is a tombstone."""
    found = _typed_keys(split, hi)
    if found is not None:
        return found
    table = read_split_columns(split, 0, hi)
    if table is None:
        pairs = [(r.key, r.value is None) for r in read_split(split) if r.offset < hi]
        keys_list = [k for k, _ in pairs]
        keys: pa.Array = pa.array(keys_list, pa.binary())
        tomb = np.fromiter((t for _, t in pairs), bool, len(pairs))
    else:
        keys = table.column("key").combine_chunks().cast(pa.binary())
        tomb = table.column("value").is_null().to_numpy(zero_copy_only=False)
    return _keyed(keys, tomb)


def _keyed(keys: pa.Array, tomb: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """Without keyless records and schema records."""
    schema = pc.equal(keys, pa.scalar(SCHEMA_KEY, pa.binary())).fill_null(True)  # null keys go too
    keep = ~schema.to_numpy(zero_copy_only=False)
    if keep.all():
        return keys, tomb
    return keys.filter(pa.array(keep)), tomb[keep]


def _typed_keys(split: Split, hi: int) -> tuple[pa.Array, np.ndarray] | None:
    """`split_keys` by the typed twin, or None (not built, the file changed, a line not intact)."""
    if _key_spans is None:
        return None
    found = decode_split(split, hi, _spans, lambda s: (int(s[1][0]), int(s[1][-1])))
    if found is None:
        return None
    (data, offs, ks, ke, tomb), hi = found
    below = offs < hi
    keyed = below & (ks >= 0)
    keys = gather(np.frombuffer(data, np.uint8), ks[keyed], ke[keyed])
    return _keyed(keys, tomb[keyed].astype(bool))


def gather(buf: np.ndarray, start: np.ndarray, stop: np.ndarray) -> pa.Array:
    """The byte ranges [start, stop) of `buf` as one compact binary array (a copy of just those
    bytes, gathered by one vectorised index: no Python object per value)."""
    lengths = stop - start
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    index = np.repeat(start - offsets[:-1], lengths) + np.arange(offsets[-1])
    values = buf[index]
    # int32 offsets (a split is far below 2 GiB): Arrow hashes `binary` much faster than `large_binary`
    small = offsets.astype(np.int32)
    return pa.Array.from_buffers(pa.binary(), len(lengths), [None, pa.py_buffer(small), pa.py_buffer(values)])


def _spans(data: bytes) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The lines' offsets, key spans and tombstone flags (the typed twin), or None."""
    assert _key_spans is not None
    if len(data) >= 1 << 31:  # `text_spans` addresses 31 bits
        return None
    cap = len(data) // _SHORTEST_LINE + 1
    offs, ks, ke = np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, np.int64)
    tomb = np.empty(cap, np.uint8)
    n = _key_spans(data, offs, ks, ke, tomb)
    if n <= 0:
        return None
    return data, offs[:n], ks[:n], ke[:n], tomb[:n]
