"""The typed hot path (capture/_hotpath.pyx, Cython), each function None when its pure-Python
reference runs instead (`tributary.impl` decides: `TRIBUTARY_IMPL`, or the module not built).

Each function is a twin of a pure-Python reference (`InsertTemplate.encode_many_python`,
`reader.take_copy_python` (capture/snapshot/reader.py), and for `take_inserts` the receive loop with `SourceSession.handle`);
`encode_inserts` answers None whenever it is not sure of the reference's result, and the caller
then runs the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tributary.impl import twin

__all__ = ["encode_inserts", "take_copy", "take_inserts"]

encode_inserts: Callable[[tuple[object, ...], list[bytes], bytes], tuple[list[bytes], list[bytes]] | None] | None
take_copy: Callable[[Callable[[int], tuple[int, Any]], bytearray, int], int] | None
take_inserts: Callable[[Callable[[int], tuple[int, Any]], list[bytes], int], tuple[int, Any] | None] | None

encode_inserts = twin("capture._hotpath", "encode_inserts")
take_copy = twin("capture._hotpath", "take_copy")
take_inserts = twin("capture._hotpath", "take_inserts")
