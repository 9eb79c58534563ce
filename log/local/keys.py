"""A topic's live keys: those whose latest committed record is not a tombstone, as a compacted read
shows them (what a re-snapshot and a chunked snapshot's key check compare the table with)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tributary.log.local.splits import read_split
from tributary.log.local.types import Split

__all__ = ["SCAN_BYTES", "SCHEMA_KEY", "live_keys_in"]

SCHEMA_KEY = b'{"__schema__":true}'
"""The key of capture's schema records (capture/records/schema_tracker.py; the log cannot import capture):
never a live key, and `admin.topics` counts them apart from the data records."""

SCAN_BYTES = 8 << 20  # a topic's keys are read this much segment data at a time (bounds memory)


def live_keys_in(splits: Sequence[Split], ends: Sequence[int]) -> set[bytes]:
    """The live keys of one topic's `splits` (each partition's in offset order) up to `ends`
    (committed end per partition), schema records and keyless records aside. Holds a bytes object
    and a set slot per key (docs/capture.md says how much). Each split is decoded whole into Arrow
    columns (`read_split_columns`, as the projections' reader does), record by record only where
    that path refuses."""
    import pyarrow as pa

    from tributary.log.local.columnar import read_split_columns

    live: set[bytes] = set()
    add, discard = live.add, live.discard
    for split in splits:
        end = ends[split.partition]
        table = read_split_columns(split, 0, end)
        pairs: Iterable[tuple[bytes | None, bool]]
        if table is None:
            pairs = ((r.key, r.value is None) for r in read_split(split) if r.offset < end)
        else:
            keys = table.column("key").cast(pa.binary()).to_pylist()
            pairs = zip(keys, table.column("value").is_null().to_pylist(), strict=True)
        for key, tombstone in pairs:
            if key is None or key == SCHEMA_KEY:
                continue
            if tombstone:
                discard(key)
            else:
                add(key)
    return live
