"""Finding the user's aggregates: `[eventstore] modules = ["my_domain/orders.py", "package.module", …]`.

A module exports `AGGREGATE` (an `Aggregate`) or `AGGREGATES` (a list of them). Whatever is wrong
with one (it does not import, exports nothing, a definition breaks a rule, two define one stream
type) raises `AggregateDefinitionError` with one line that names the module and the problem.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from tributary.eventstore.aggregate import Aggregate
from tributary.eventstore.errors import AggregateDefinitionError

__all__ = ["is_path", "load_aggregates", "load_module"]


def is_path(ref: str) -> bool:
    """A file reference (`x/y.py`), as opposed to a dotted module name."""
    return ref.endswith(".py") or "/" in ref


def load_module(ref: str) -> ModuleType:
    """Import a domain file (`x/y.py`, relative to the working directory) or a dotted module."""
    if is_path(ref) and not Path(ref).is_file():
        raise AggregateDefinitionError(f"[eventstore] modules: no file {ref!r}")
    try:
        if is_path(ref):
            return _load_file(ref)
        return importlib.import_module(ref)
    except AggregateDefinitionError as exc:  # an Aggregate(...) in the module broke a rule
        raise AggregateDefinitionError(f"{ref}: {_where(exc, ref)}{exc}") from None
    except ModuleNotFoundError as exc:
        if not is_path(ref) and exc.name is not None and ref.startswith(exc.name):
            raise AggregateDefinitionError(f"[eventstore] modules: no module {ref!r}") from None
        raise AggregateDefinitionError(f"{ref}: {_where(exc, ref)}{type(exc).__name__}: {exc}") from None
    except SyntaxError as exc:
        line = f"line {exc.lineno}: " if exc.lineno else ""
        raise AggregateDefinitionError(f"{ref}: {line}{type(exc).__name__}: {exc.msg}") from None
    except Exception as exc:  # noqa: BLE001 - a user's module may raise anything; said in one line
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise AggregateDefinitionError(f"{ref}: {_where(exc, ref)}{type(exc).__name__}: {first}") from None


def _load_file(ref: str) -> ModuleType:
    path = Path(ref).resolve()
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    name = f"tributary_domain_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError("not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _where(exc: BaseException, ref: str) -> str:
    """`line N: ` of the innermost frame in the module's own file, when there is one."""
    target = str(Path(ref).resolve()) if is_path(ref) else ref.replace(".", "/")
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == target or frame.filename.endswith(target + ".py"):
            line = frame.lineno
    return f"line {line}: " if line else ""


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
