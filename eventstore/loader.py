"""Finding the user's aggregates: `[eventstore] modules = ["my_domain/orders.py", "package.module", …]`.

A module exports `AGGREGATE` (an `Aggregate`) or `AGGREGATES` (a list of them). Whatever is wrong
with one (it does not import, exports nothing, a definition breaks a rule, two define one stream
type) raises `AggregateDefinitionError` with one line that names the module and the problem.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from tributary.eventstore.aggregate import Aggregate
from tributary.eventstore.errors import AggregateDefinitionError
from tributary.user_files import describe, file_stamp, forget, import_file, is_path, module_name, where

__all__ = ["is_path", "load_aggregates", "load_current", "load_module"]


def load_module(ref: str) -> ModuleType:
    """Import a domain file (`x/y.py`; `load_settings` makes it absolute, beside the config file)
    or a dotted module. The file's directory is importable while it runs (`from helpers import x`)."""
    if is_path(ref) and not Path(ref).is_file():
        raise AggregateDefinitionError(f"[eventstore] modules: no file {ref!r}")
    try:
        if is_path(ref):
            return import_file(Path(ref), module_name("tributary_domain", Path(ref)))
        return importlib.import_module(ref)
    except AggregateDefinitionError as exc:  # an Aggregate(...) in the module broke a rule
        raise AggregateDefinitionError(f"{ref}: {where(exc, ref)}{exc}") from None
    except ModuleNotFoundError as exc:
        if not is_path(ref) and exc.name is not None and ref.startswith(exc.name):
            raise AggregateDefinitionError(f"[eventstore] modules: no module {ref!r}") from None
        raise AggregateDefinitionError(describe(exc, ref)) from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a user's module may raise anything, sys.exit() too; said in one line
        raise AggregateDefinitionError(describe(exc, ref)) from None


def _exports(module: ModuleType, ref: str) -> list[Aggregate[Any]]:
    found = getattr(module, "AGGREGATES", None)
    if found is None:
        one = getattr(module, "AGGREGATE", None)
        found = [] if one is None else [one]
    if isinstance(found, Aggregate):
        found = [found]
    try:
        out = list(found)
    except TypeError:
        out = [found]
    if not out:
        raise AggregateDefinitionError(f"{ref}: exports no AGGREGATE (an Aggregate) or AGGREGATES (a list of them)")
    for item in out:
        if not isinstance(item, Aggregate):
            raise AggregateDefinitionError(
                f"{ref}: AGGREGATE(S) must be tributary.eventstore.aggregate.Aggregate, not {type(item).__name__}"
            )
    return out


def load_aggregates(modules: Sequence[str]) -> dict[str, Aggregate[Any]]:
    """Every aggregate the config names, by stream type; a stream type defined twice is an error."""
    found: dict[str, Aggregate[Any]] = {}
    origin: dict[str, str] = {}
    for ref in modules:
        for agg in _exports(load_module(ref), ref):
            if agg.stream_type in found:
                raise AggregateDefinitionError(
                    f"{ref}: stream type {agg.stream_type!r} is already defined by {origin[agg.stream_type]}"
                )
            found[agg.stream_type], origin[agg.stream_type] = agg, ref
    return found


_stamps: dict[str, tuple[str, int, int] | None] = {}
_stamps_lock = threading.Lock()


def load_current(modules: Sequence[str]) -> dict[str, Aggregate[Any]]:
    """`load_aggregates`, importing again every module whose file changed since this process last
    imported it: `tributary serve` follows domain files edited or added while it runs."""
    with _stamps_lock:
        for ref in modules:
            stamp = file_stamp(ref)
            if ref in _stamps and _stamps[ref] != stamp:
                if is_path(ref):
                    forget(module_name("tributary_domain", Path(ref)))
                else:
                    sys.modules.pop(ref, None)
            _stamps[ref] = stamp
        return load_aggregates(modules)
