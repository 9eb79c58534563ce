"""A topic's live keys: those whose latest committed record is not a tombstone, as a compacted read
shows them (schema records and keyless records aside): what a re-snapshot and a chunked
snapshot's key check compare the table with.

A re-snapshot needs only each record's key and whether its value is null: the typed twin
(`_typed.key_spans`) finds both in a split's bytes, checking each line as the decoder does,
without decoding values; the reference decodes the split whole (`decode_lines`), record by
record where that refuses (`read_split`, which says what is wrong). The latest record of each
key is found by one hash aggregation over a whole partition (keyscan.py, which loads pyarrow:
imported when a scan runs, so that opening a log does not pay for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tributary.log.local.types import Split

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["SCAN_BYTES", "SCHEMA_KEY", "live_key_array_in", "live_keys_in"]

SCHEMA_KEY = b'{"__schema__":true}'
"""The key of capture's schema records (capture/schema_tracker.py; the log cannot import capture):
never a live key, and `admin.topics` counts them apart from the data records."""

SCAN_BYTES = 8 << 20  # a topic's keys are read this much segment data at a time (bounds memory)


def live_keys_in(splits: Sequence[Split], ends: Sequence[int]) -> set[bytes]:
    """The live keys of one topic's `splits` (each partition's in offset order) up to `ends`
    (committed end per partition), as a set: a bytes object and a set slot per key (docs/capture.md
    says how much)."""
    return set(live_key_array_in(splits, ends).to_pylist())


def live_key_array_in(splits: Sequence[Split], ends: Sequence[int]) -> pa.Array:
    """The same as one Arrow binary array (no Python object per key)."""
    from tributary.log.local import keyscan

    return keyscan.live_key_array_in(splits, ends)
