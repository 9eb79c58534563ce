"""The compiled hot path (capture/_speedups.c) if it was built, else None for each function.

Each compiled function is a twin of a pure-Python reference (`InsertTemplate.encode_many_python`,
`codec.encode_plain_python`) and answers None whenever it is not sure of the reference's bytes;
callers then run the reference. Missing (no compiler at install time): one warning, then the
reference alone, slower. `TRIBUTARY_PURE_PYTHON=1` turns it off on purpose (A/B runs).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

__all__ = ["encode_inserts", "encode_plain"]

encode_inserts: Callable[[tuple[object, ...], list[bytes], bytes], tuple[list[bytes], list[bytes]] | None] | None
encode_plain: Callable[[int, int, Sequence[bytes], Sequence[bytes]], tuple[bytes, list[int]] | None] | None

if os.environ.get("TRIBUTARY_PURE_PYTHON") == "1":
    encode_inserts = encode_plain = None
else:
    try:
        from capture._speedups import encode_inserts, encode_plain
    except ImportError as exc:  # not built: the references give the same bytes, more slowly
        encode_inserts = encode_plain = None
        logging.getLogger(__name__).warning(
            "capture: the compiled hot path (capture._speedups) is not available (%s); using pure Python", exc
        )
