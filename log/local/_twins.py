"""The log's typed twins (log/local/_typed.pyx, Cython), looked up through `tributary.impl`.

Each twin stands beside a pure-Python reference that stays the fallback: a twin is None when the
module was not built or `TRIBUTARY_IMPL=python` turns the compiled code off."""

from __future__ import annotations

from typing import Any

from tributary.impl import twin

__all__ = ["typed_twin"]


def typed_twin(name: str) -> Any:
    """`_typed.<name>`, or None when its pure-Python reference runs instead."""
    return twin("log._typed", name)
