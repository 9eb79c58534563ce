"""An aggregate is two pure functions plus its schemas: the rules are testable without a database.

`decide(state, command) -> [event]` raises `CommandRejected`; `evolve(state, event) -> state`.
Commands and events are pydantic models keyed by type name; upcasters lift old event versions on
read, so `evolve` only ever sees the current shape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from tributary.eventstore.errors import InvalidCommand, UnknownCommand

__all__ = ["Aggregate", "Upcaster", "fold"]

S = TypeVar("S", bound=BaseModel)

# (event type, schema version) -> function lifting data to schema version + 1
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Aggregate(Generic[S]):
    stream_type: str
    state_type: type[S]
    commands: Mapping[str, type[BaseModel]]
    events: Mapping[str, type[BaseModel]]
    decide: Callable[[S, BaseModel], Sequence[BaseModel]]
    evolve: Callable[[S, BaseModel], S]
    upcasters: Mapping[tuple[str, int], Upcaster] = field(default_factory=dict)
    event_versions: Mapping[str, int] = field(default_factory=dict)  # current schema version per type

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
        return type(event).__name__

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
        return self.events[event_type].model_validate(current)


def fold(aggregate: Aggregate[S], state: S, events: Sequence[BaseModel]) -> S:
    for event in events:
        state = aggregate.evolve(state, event)
    return state
