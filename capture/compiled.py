"""The typed hot path (capture/_hotpath.pyx, Cython) if it was built, else None for each function.

Each function is a twin of a pure-Python reference (`InsertTemplate.encode_many_python`,
`reader.take_copy_python` (capture/snapshot/reader.py), and for `take_inserts` the receive loop with `SourceSession.handle`);
`encode_inserts` answers None whenever it is not sure of the reference's result, and the caller
then runs the reference. Missing (not built): one warning, then the references alone, slower.
`TRIBUTARY_PURE_PYTHON=1` turns it off on purpose.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

__all__ = ["encode_inserts", "take_copy", "take_inserts"]

encode_inserts: Callable[[tuple[object, ...], list[bytes], bytes], tuple[list[bytes], list[bytes]] | None] | None
take_copy: Callable[[Callable[[int], tuple[int, Any]], bytearray, int], int] | None
take_inserts: Callable[[Callable[[int], tuple[int, Any]], list[bytes], int], tuple[int, Any] | None] | None

_OFF = os.environ.get("TRIBUTARY_PURE_PYTHON") == "1"
try:
    if _OFF:
        raise ImportError("TRIBUTARY_PURE_PYTHON=1")
    from tributary.capture._hotpath import encode_inserts, take_copy, take_inserts
except ImportError as exc:  # not built (or turned off): the references give the same bytes, more slowly
    encode_inserts = take_copy = take_inserts = None
    if not _OFF:
        logging.getLogger(__name__).warning(
            "capture: the typed hot path (capture._hotpath) is not available (%s); using pure Python", exc
        )
