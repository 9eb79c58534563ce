"""A topic's live keys: those whose latest committed record is not a tombstone, as a compacted read
shows them (schema records and keyless records aside): what a re-snapshot and a chunked
snapshot's key check compare the table with.

A re-snapshot needs only each record's key and whether its value is null: the typed twin
(`_typed.key_spans`) finds both in a split's bytes, checking each line as the decoder does,
without decoding values; the reference decodes the split whole (`decode_lines`), record by
record where that refuses (`read_split`, which says what is wrong). The latest record of each
key is found by one hash aggregation over a whole partition. The scan is keyscan.py (it loads
pyarrow: `Log.live_keys` imports it when a scan runs, so that opening a log does not pay for it);
this module holds what the rest of the log needs to know of keys without it.
"""

from __future__ import annotations

__all__ = ["SCAN_BYTES", "SCHEMA_KEY"]

SCHEMA_KEY = b'{"__schema__":true}'
"""The key of capture's schema records (capture/records/schema_tracker.py; the log cannot import capture):
never a live key, and `admin.topics` counts them apart from the data records."""

SCAN_BYTES = 8 << 20  # a topic's keys are read this much segment data at a time (bounds memory)
