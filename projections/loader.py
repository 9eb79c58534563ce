"""Finding projections: `[projections] modules = ["path/to/file.py", "package.module", …]`.

A module exports `PROJECTION` or `PROJECTIONS` (a list). Spark workers call `load` again with the
same references (cached per process) instead of unpickling user functions.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from tributary.projections.definition import Projection
from tributary.projections.errors import DefinitionError
from tributary.user_files import describe, file_stamp, forget, import_file, is_path, module_name

__all__ = ["file_stamps", "load", "load_current", "load_module", "resolve"]


def load_module(ref: str) -> ModuleType:
    """A file path (`x/y.py`; `load_settings` makes it absolute, beside the config file) or a
    dotted module name. The file's directory is importable while it runs (`from helpers import x`),
    here and on Spark's workers. Whatever the module raises (`sys.exit()` too) is one line naming it."""
    if is_path(ref) and not Path(ref).is_file():
        raise DefinitionError(f"[projections] modules: no file {ref!r}")
    try:
        if is_path(ref):
            return import_file(Path(ref), module_name("tributary_projection", Path(ref)))
        return importlib.import_module(ref)
    except DefinitionError:  # a Projection(...) in the module broke a rule: it names the field
        raise
    except ModuleNotFoundError as exc:
        if not is_path(ref) and exc.name is not None and ref.startswith(exc.name):
            raise DefinitionError(f"[projections] modules: cannot import {ref!r}: {exc}") from None
        raise DefinitionError(describe(exc, ref)) from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a user's module may raise anything, sys.exit() too; said in one line
        raise DefinitionError(describe(exc, ref)) from None


def _exports(module: ModuleType, ref: str) -> list[Projection]:
    found = getattr(module, "PROJECTIONS", None)
    if found is None:
        one = getattr(module, "PROJECTION", None)
        found = [] if one is None else [one]
    out = list(found)
    if not out or not all(isinstance(p, Projection) for p in out):
        raise DefinitionError(f"{ref!r} must export PROJECTION (a Projection) or PROJECTIONS (a list)")
    return out


@lru_cache(maxsize=32)
def load(modules: tuple[str, ...], mirror: tuple[str, ...] = ()) -> dict[str, Projection]:
    """Every projection the config names, by name; duplicate names are an error."""
    from tributary.projections.mirror import mirror_projection

    found: dict[str, Projection] = {}
    candidates = [(ref, p) for ref in modules for p in _exports(load_module(ref), ref)]
    candidates += [(f"mirror {t}", mirror_projection(t)) for t in mirror]
    for ref, p in candidates:
        if p.name in found:
            raise DefinitionError(f"two projections are named {p.name!r} (second from {ref!r})")
        found[p.name] = p
    return found


def resolve(modules: Sequence[str], mirror: Sequence[str], name: str) -> Projection:
    projections = load(tuple(modules), tuple(mirror))
    if name not in projections:
        known = ", ".join(sorted(projections)) or "none"
        raise DefinitionError(f"no projection named {name!r} (configured: {known})")
    return projections[name]


def _stamp(ref: str) -> tuple[str, int, int] | None:
    return file_stamp(ref)


_stamps: dict[str, tuple[str, int, int] | None] = {}
_stamps_lock = threading.RLock()


def file_stamps(modules: Sequence[str]) -> tuple[tuple[str, int, int] | None, ...]:
    """What the projection files look like on disk now: equal stamps, same code."""
    return tuple(_stamp(ref) for ref in modules)


def load_current(modules: tuple[str, ...], mirror: tuple[str, ...] = ()) -> dict[str, Projection]:
    """`load`, re-reading every module whose file changed since this process last read it.

    A long-running process (`tributary serve`) calls this per request: a projection file added to
    the config or edited on disk is seen without a restart. Unchanged files cost one `stat` each."""
    with _stamps_lock:  # the API's threads (views, status, metrics) may ask at the same time
        changed = False
        for ref in modules:
            stamp = _stamp(ref)
            if ref in _stamps and _stamps[ref] != stamp:
                changed = True
                _forget(ref)
            _stamps[ref] = stamp
        if changed:
            load.cache_clear()
        return load(modules, mirror)


def _forget(ref: str) -> None:
    """Drop a module from `sys.modules` so that the next `load_module` executes its file again
    (and the files beside it that it imported)."""
    if is_path(ref):
        forget(module_name("tributary_projection", Path(ref)))
    else:
        sys.modules.pop(ref, None)
