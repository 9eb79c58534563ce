"""Finding the user's aggregates: `[eventstore] modules = ["my_domain/orders.py", "package.module", …]`.

A module exports `AGGREGATE` (an `Aggregate`) or `AGGREGATES` (a list of them). Whatever is wrong
with one (it does not import, exports nothing, a definition breaks a rule, two define one stream
type) raises `AggregateDefinitionError` with one line that names the module and the problem.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from tributary.eventstore.aggregate import Aggregate
from tributary.eventstore.errors import AggregateDefinitionError
from tributary.user_files import Messages, UserModules, is_path

__all__ = ["is_path", "load_aggregates", "load_current", "load_module"]

_DOMAINS: UserModules[Aggregate[Any]] = UserModules(
    prefix="tributary_domain",
    kind=Aggregate,
    one="AGGREGATE",
    many="AGGREGATES",
    error=AggregateDefinitionError,
    messages=Messages(
        no_file="[eventstore] modules: no file {ref!r}",
        no_module="[eventstore] modules: no module {ref!r}",
        exports_none="{ref}: exports no AGGREGATE (an Aggregate) or AGGREGATES (a list of them)",
        exports_other="{ref}: AGGREGATE(S) must be tributary.eventstore.aggregate.Aggregate, not {type}",
        broken_rule="{ref}: {where}{exc}",  # an Aggregate(...) in the module broke a rule
    ),
)


def load_module(ref: str) -> ModuleType:
    """Import a domain file (`x/y.py`; `load_settings` makes it absolute, beside the config file)
    or a dotted module. The file's directory is importable while it runs (`from helpers import x`)."""
    return _DOMAINS.load_module(ref)


def load_aggregates(modules: Sequence[str]) -> dict[str, Aggregate[Any]]:
    """Every aggregate the config names, by stream type; a stream type defined twice is an error."""
    found: dict[str, Aggregate[Any]] = {}
    origin: dict[str, str] = {}
    for ref in modules:
        for agg in _DOMAINS.exports(load_module(ref), ref):
            if agg.stream_type in found:
                raise AggregateDefinitionError(
                    f"{ref}: stream type {agg.stream_type!r} is already defined by {origin[agg.stream_type]}"
                )
            found[agg.stream_type], origin[agg.stream_type] = agg, ref
    return found


def load_current(modules: Sequence[str]) -> dict[str, Aggregate[Any]]:
    """`load_aggregates`, importing again every module whose file changed since this process last
    imported it: `tributary serve` follows domain files edited or added while it runs."""
    with _DOMAINS.lock:
        _DOMAINS.forget_changed(modules)
        return load_aggregates(modules)
