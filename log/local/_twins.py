"""The log's typed twins (log/local/_typed.pyx, Cython), looked up in one place.

Each twin stands beside a pure-Python reference that stays the fallback: a twin is None when the
module was not built or `TRIBUTARY_PURE_PYTHON=1` turns the typed code off."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["typed_twin"]


def typed_twin(name: str) -> Any:
    """`_typed.<name>`, or None when the typed module is off or missing."""
    if os.environ.get("TRIBUTARY_PURE_PYTHON") == "1":
        return None
    try:
        import tributary.log.local._typed as _typed
    except ImportError:
        return None
    return getattr(_typed, name)
