"""Which code runs the typed twins: the compiled (Cython) modules or their pure-Python references.

One switch for every twin, read from the environment once per process, as psycopg's PSYCOPG_IMPL:
`TRIBUTARY_IMPL=python` runs the references (the compiled modules are not even imported);
`TRIBUTARY_IMPL=compiled` requires every compiled module and stops with one line naming a missing
one; unset, each module that was built is used, and a missing one costs one warning per process.
`TRIBUTARY_PURE_PYTHON=1` is the older spelling of `TRIBUTARY_IMPL=python`.

The bottom layer: capture and the log both look their twins up here, so this module imports
nothing of the project; it loads the compiled modules by the import names in `COMPILED`.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

__all__ = ["COMPILED", "ENV", "PURE_PYTHON_ENV", "ImplError", "Mode", "Selection", "requested", "selection", "twin"]

ENV = "TRIBUTARY_IMPL"
PURE_PYTHON_ENV = "TRIBUTARY_PURE_PYTHON"  # the older switch: "1" means TRIBUTARY_IMPL=python

Mode = Literal["python", "compiled"]
_MODES: tuple[Mode, ...] = ("python", "compiled")

# The name users read (in `--version`, /metrics, errors) → the module's import name. A module that
# moves changes its import name here, and nothing else.
COMPILED: dict[str, str] = {
    "capture._hotpath": "tributary.capture._hotpath",
    "log._typed": "tributary.log.local._typed",
}

_BUILD = "`make setup` (or `pip install -e .` with a C compiler)"

_log = logging.getLogger(__name__)


class ImplError(RuntimeError):
    """The switch asks for what this process cannot do: a value it does not know, or `compiled`
    without the build. Not an ImportError, so that no optional-import fallback swallows it."""


@dataclass(frozen=True)
class Selection:
    """Which compiled modules run (by the names of `COMPILED`), and which run as their references."""

    compiled: tuple[str, ...]
    python: tuple[str, ...]

    @property
    def name(self) -> str:
        """One word for a label: compiled, python, or mixed (some built, some not)."""
        return "python" if not self.compiled else "compiled" if not self.python else "mixed"

    def __str__(self) -> str:
        if not self.compiled:
            return "python"
        text = "compiled: " + ", ".join(self.compiled)
        return text if not self.python else f"{text}; python: {', '.join(self.python)}"


def requested(env: Mapping[str, str]) -> Mode | None:
    """The mode `env` asks for; None (unset) means each compiled module where it was built."""
    raw = env.get(ENV, "")
    value = raw.strip().lower()
    alias = env.get(PURE_PYTHON_ENV) == "1"
    if not value:
        return "python" if alias else None
    if value not in _MODES:
        raise ImplError(f"{ENV}={raw!r} is not one of: {', '.join(_MODES)} (unset: compiled where built)")
    if alias and value == "compiled":
        raise ImplError(
            f"{ENV}=compiled contradicts {PURE_PYTHON_ENV}=1 (its older spelling of {ENV}=python): unset one of them"
        )
    return "python" if value == "python" else "compiled"


_loaded: dict[str, ModuleType | None] = {}  # name in COMPILED → its module, or None when missing
_warned = False  # the one warning of a missing module has been logged


@functools.cache
def _process_mode() -> Mode | None:
    """This process's mode, read once: twins looked up at import keep what they found."""
    return requested(os.environ)


def _load(name: str, mode: Mode | None) -> ModuleType | None:
    """The compiled module `name`, imported once; None (warned once per process) when it is missing
    and not required."""
    global _warned
    if name in _loaded:
        return _loaded[name]
    try:
        module: ModuleType | None = importlib.import_module(COMPILED[name])
    except ImportError as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if mode == "compiled":
            raise ImplError(
                f"{ENV}=compiled, but the compiled module {name} ({COMPILED[name]}) is missing ({why}): "
                f"build it with {_BUILD}"
            ) from exc
        if not _warned:
            _warned = True
            _log.warning(
                "the compiled module %s is not available (%s); its pure-Python references run instead, slower: "
                "build it with %s, or set %s=python to choose them",
                name,
                why,
                _BUILD,
                ENV,
            )
        module = None
    _loaded[name] = module
    return module


def _modules() -> dict[str, ModuleType | None]:
    """Every compiled module this process uses (None: its references run); `compiled` requires all."""
    mode = _process_mode()
    if mode == "python":
        return dict.fromkeys(COMPILED)
    return {name: _load(name, mode) for name in COMPILED}


def twin(module: str, name: str) -> Any:
    """The compiled function `name` of `module` (a name in `COMPILED`), or None: the caller runs
    its pure-Python reference. Raises ImplError when the switch cannot be honoured."""
    mode = _process_mode()
    if mode == "python":
        return None
    if mode == "compiled":
        _modules()  # any look-up checks every module: a partial build fails at start, not later
    loaded = _load(module, mode)
    return None if loaded is None else getattr(loaded, name)


def selection() -> Selection:
    """What runs in this process (for `--version`, /metrics, the capture status, benchmarks)."""
    modules = _modules()
    return Selection(
        compiled=tuple(n for n, m in modules.items() if m is not None),
        python=tuple(n for n, m in modules.items() if m is None),
    )
