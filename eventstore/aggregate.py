"""An aggregate is two pure functions plus its schemas: the rules are testable without a database.

`decide(state, command) -> [event]` raises `CommandRejected`; `evolve(state, event) -> state`.
Commands and events are pydantic models (commands keyed by the name a client sends, events by class
name); upcasters lift old event versions on read, so `evolve` only ever sees the current shape. The
state model's defaults are the initial state; `state_version` labels the state's shape, so a snapshot
taken by other code is never used.

A user's domain file exports `AGGREGATE = Aggregate(...)` (or `AGGREGATES = [...]`); everything is
checked when the `Aggregate` is built, so a mistake stops the program at start-up, not at a command.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from tributary.eventstore.errors import AggregateDefinitionError, InvalidCommand, UnknownCommand
from tributary.eventstore.personal import check_model

__all__ = ["Aggregate", "Upcaster", "fold"]

S = TypeVar("S", bound=BaseModel)

# lifts one event's data from schema version v to v + 1; keyed by (event type, v)
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

_STREAM_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,99}")  # also a topic name part (`events.<stream_type>`)
_COMMAND_TYPE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,99}")


@dataclass(frozen=True, kw_only=True)
class Aggregate(Generic[S]):
    """One stream type's rules. `events` is a list of event models (or a mapping by class name)."""

    stream_type: str
    state_type: type[S]
    commands: Mapping[str, type[BaseModel]]
    events: Mapping[str, type[BaseModel]] | Sequence[type[BaseModel]]
    decide: Callable[[S, Any], Sequence[BaseModel]]
    evolve: Callable[[S, Any], S]
    upcasters: Mapping[tuple[str, int], Upcaster] = field(default_factory=dict)
    event_versions: Mapping[str, int] = field(default_factory=dict)  # current schema version per type (else 1)
    state_version: int = 1
    event_models: Mapping[str, type[BaseModel]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "event_models", _check(self))

    def initial(self) -> S:
        return self.state_type()

    def parse_command(self, command_type: str, data: Mapping[str, Any]) -> BaseModel:
        model = self.commands.get(command_type)
        if model is None:
            raise UnknownCommand(
                f"{self.stream_type} has no command {command_type!r} (commands: {', '.join(sorted(self.commands))})"
            )
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            errors: list[dict[str, Any]] = [{"loc": e["loc"], "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
            raise InvalidCommand(command_type, errors) from None

    def event_type(self, event: BaseModel) -> str:
        name = type(event).__name__
        if self.event_models.get(name) is not type(event):  # a bug in the domain's code: a 500, not the client's fault
            raise TypeError(
                f"{self.stream_type}: decide returned a {name}, which is not one of its events "
                f"({', '.join(sorted(self.event_models))})"
            )
        return name

    def schema_version(self, event_type: str) -> int:
        return self.event_versions.get(event_type, 1)

    def load_event(self, event_type: str, schema_version: int, data: Mapping[str, Any]) -> BaseModel:
        """Upcast stored data to the current schema version, then parse it."""
        current = dict(data)
        version = schema_version
        target = self.schema_version(event_type)
        while version < target:
            upcast = self.upcasters.get((event_type, version))
            if upcast is None:
                raise ValueError(f"no upcaster for {event_type} v{version} -> v{version + 1}")
            current = upcast(current)
            version += 1
        return self.event_models[event_type].model_validate(current)


def fold(aggregate: Aggregate[S], state: S, events: Sequence[BaseModel]) -> S:
    for event in events:
        state = aggregate.evolve(state, event)
    return state


def _is_model(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _check(agg: Aggregate[Any]) -> dict[str, type[BaseModel]]:
    """Every rule a definition must follow; the first one broken raises, naming what to fix."""

    def bad(problem: str) -> AggregateDefinitionError:
        return AggregateDefinitionError(problem)

    if not isinstance(agg.stream_type, str) or not _STREAM_TYPE.fullmatch(agg.stream_type):
        raise bad(
            f"stream_type {agg.stream_type!r} must start with a letter and hold only letters, digits, '_' and '-' "
            "(at most 100)"
        )
    where = f"aggregate {agg.stream_type!r}"
    if not _is_model(agg.state_type):
        raise bad(f"{where}: state_type must be a pydantic model class, not {agg.state_type!r}")
    try:
        agg.state_type()
    except ValidationError:
        raise bad(
            f"{where}: state_type {agg.state_type.__name__} needs a default for every field (its defaults are the "
            "initial state)"
        ) from None
    for name in ("decide", "evolve"):
        if not callable(getattr(agg, name)):
            raise bad(f"{where}: {name} must be a function, not {getattr(agg, name)!r}")
    if isinstance(agg.state_version, bool) or not isinstance(agg.state_version, int) or agg.state_version < 1:
        raise bad(f"{where}: state_version must be an integer ≥ 1, not {agg.state_version!r}")
    if not isinstance(agg.commands, Mapping) or not agg.commands:
        raise bad(f"{where}: commands must be a non-empty mapping of command name to pydantic model")
    for name, model in agg.commands.items():
        if not isinstance(name, str) or not _COMMAND_TYPE.fullmatch(name):
            raise bad(
                f"{where}: command name {name!r} must be a word of letters, digits, '_', '.' or '-' (at most 100)"
            )
        if not _is_model(model):
            raise bad(f"{where}: command {name!r} must be a pydantic model class, not {model!r}")
    models = _event_models(where, agg.events)
    for model in models.values():
        problem = check_model(model)
        if problem is not None:
            raise bad(f"{where}: {problem}")
    for name, version in agg.event_versions.items():
        if name not in models:
            raise bad(f"{where}: event_versions names {name!r}, which has no model among the events")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise bad(f"{where}: event_versions[{name!r}] must be an integer ≥ 1, not {version!r}")
    for key, upcast in agg.upcasters.items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise bad(f"{where}: upcaster keys are (event type, schema version), not {key!r}")
        name, version = key
        if name not in models:
            raise bad(f"{where}: an upcaster names event {name!r}, which has no model among the events")
        if not isinstance(version, int) or not 1 <= version < agg.schema_version(name):
            raise bad(
                f"{where}: upcaster ({name!r}, {version!r}) lifts no version below {name}'s current schema version "
                f"{agg.schema_version(name)} (set event_versions)"
            )
        if not callable(upcast):
            raise bad(f"{where}: upcaster ({name!r}, {version}) must be a function")
    for name in models:
        for version in range(1, agg.schema_version(name)):
            if (name, version) not in agg.upcasters:
                raise bad(
                    f"{where}: {name} is at schema version {agg.schema_version(name)} but has no upcaster from v{version}"
                )
    return models


def _event_models(where: str, events: object) -> dict[str, type[BaseModel]]:
    if isinstance(events, Mapping):
        items = list(events.items())
    elif isinstance(events, Sequence) and not isinstance(events, str):
        items = [(getattr(e, "__name__", repr(e)), e) for e in events]
    else:
        raise AggregateDefinitionError(f"{where}: events must be a list of pydantic model classes")
    if not items:
        raise AggregateDefinitionError(f"{where}: events must name at least one event model")
    models: dict[str, type[BaseModel]] = {}
    for name, model in items:
        if not _is_model(model):
            raise AggregateDefinitionError(f"{where}: event {name!r} must be a pydantic model class, not {model!r}")
        if name != model.__name__:
            raise AggregateDefinitionError(
                f"{where}: event {name!r} is keyed by another name than its class {model.__name__} (events are "
                "stored under their class name)"
            )
        if name in models:
            raise AggregateDefinitionError(f"{where}: two events are named {name!r}")
        models[name] = model
    return models
