"""Finding projections: `[projections] modules = ["path/to/file.py", "package.module", …]`.

A module exports `PROJECTION` or `PROJECTIONS` (a list). Spark workers call `load` again with the
same references (cached per process) instead of unpickling user functions.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from types import ModuleType

from tributary.projections.definition import Projection
from tributary.projections.errors import DefinitionError
from tributary.user_files import Messages, UserModules, file_stamp

__all__ = ["file_stamps", "load", "load_current", "load_module", "load_shipped", "resolve", "shipped"]

_EXPORTS = "{ref!r} must export PROJECTION (a Projection) or PROJECTIONS (a list)"
_PROJECTIONS: UserModules[Projection] = UserModules(
    prefix="tributary_projection",
    kind=Projection,
    one="PROJECTION",
    many="PROJECTIONS",
    error=DefinitionError,
    messages=Messages(
        no_file="[projections] modules: no file {ref!r}",
        no_module="[projections] modules: cannot import {ref!r}: {exc}",
        exports_none=_EXPORTS,
        exports_other=_EXPORTS,
        broken_rule=None,  # a Projection(...) in the module broke a rule: its error names the field
    ),
)


def load_module(ref: str) -> ModuleType:
    """A file path (`x/y.py`; `load_settings` makes it absolute, beside the config file) or a
    dotted module name. The file's directory is importable while it runs (`from helpers import x`),
    here and on Spark's workers. Whatever the module raises (`sys.exit()` too) is one line naming it."""
    return _PROJECTIONS.load_module(ref)


@lru_cache(maxsize=32)
def load(modules: tuple[str, ...], mirror: tuple[str, ...] = ()) -> dict[str, Projection]:
    """Every projection the config names, by name; duplicate names are an error."""
    from tributary.projections.mirror import mirror_projection

    found: dict[str, Projection] = {}
    candidates = [(ref, p) for ref in modules for p in _PROJECTIONS.exports(load_module(ref), ref)]
    candidates += [(f"mirror {t}", mirror_projection(t)) for t in mirror]
    for ref, p in candidates:
        if p.name in found:
            raise DefinitionError(f"two projections are named {p.name!r} (second from {ref!r})")
        found[p.name] = p
    return found


def shipped(modules: Sequence[str]) -> tuple[str, ...]:
    """`modules` as this host can load them: a file path that does not exist here but was sent
    with the Spark job (`cluster.ship_files`) is read from the executor's copy."""
    out = []
    for ref in modules:
        if ref.endswith(".py") and not os.path.exists(ref):
            root = _spark_files()
            copy = os.path.join(root, os.path.basename(ref)) if root else ""
            ref = copy if copy and os.path.isfile(copy) else ref
        out.append(ref)
    return tuple(out)


def _spark_files() -> str | None:
    """Where this Spark task's shipped files are (None outside a task)."""
    try:
        from pyspark import SparkFiles, TaskContext
    except ImportError:
        return None
    return SparkFiles.getRootDirectory() if TaskContext.get() is not None else None


def load_shipped(modules: tuple[str, ...], mirror: tuple[str, ...] = ()) -> dict[str, Projection]:
    """`load`, with files missing here read from the copies the job shipped (`shipped`)."""
    return load(shipped(modules), mirror)


def resolve(modules: Sequence[str], mirror: Sequence[str], name: str) -> Projection:
    projections = load_shipped(tuple(modules), tuple(mirror))
    if name not in projections:
        known = ", ".join(sorted(projections)) or "none"
        raise DefinitionError(f"no projection named {name!r} (configured: {known})")
    return projections[name]


def file_stamps(modules: Sequence[str]) -> tuple[tuple[str, int, int] | None, ...]:
    """What the projection files look like on disk now: equal stamps, same code."""
    return tuple(file_stamp(ref) for ref in modules)


def load_current(modules: tuple[str, ...], mirror: tuple[str, ...] = ()) -> dict[str, Projection]:
    """`load`, re-reading every module whose file changed since this process last read it.

    A long-running process (`tributary serve`) calls this per request: a projection file added to
    the config or edited on disk is seen without a restart. Unchanged files cost one `stat` each."""
    with _PROJECTIONS.lock:  # the API's threads (views, status, metrics) may ask at the same time
        if _PROJECTIONS.forget_changed(modules):
            load.cache_clear()
        return load(modules, mirror)
