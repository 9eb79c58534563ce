"""A test domain: a tally that counts up by `add {n}` and is closed by `close {}`.

`make_tally(state_version=…, scale=…)` builds variants of one aggregate whose `evolve` differs (a
"fixed" fold that scales each addition), so tests can change the code behind stored snapshots.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tributary.eventstore.aggregate import Aggregate
from tributary.eventstore.errors import CommandRejected

__all__ = ["AGGREGATE", "Add", "Added", "Close", "Closed", "Tally", "make_tally"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Add(_Model):
    n: int = Field(ge=1, le=1000)
    note: str = Field(default="", max_length=50)


class Close(_Model):
    pass


class Added(_Model):
    n: int
    note: str = ""


class Closed(_Model):
    pass


class Tally(_Model):
    status: Literal["open", "closed"] = "open"
    total: int = 0
    count: int = 0


def decide(state: Tally, command: BaseModel) -> list[BaseModel]:
    if state.status == "closed":
        raise CommandRejected("tally_open", "the tally is closed")
    if isinstance(command, Add):
        return [Added(n=command.n, note=command.note)]
    return [Closed()]


def make_tally(*, state_version: int = 1, scale: int = 1) -> Aggregate[Tally]:
    def evolve(state: Tally, event: BaseModel) -> Tally:
        if isinstance(event, Added):
            return state.model_copy(update={"total": state.total + scale * event.n, "count": state.count + 1})
        if isinstance(event, Closed):
            return state.model_copy(update={"status": "closed"})
        return state

    return Aggregate(
        stream_type="tally",
        state_type=Tally,
        commands={"add": Add, "close": Close},
        events=[Added, Closed],
        decide=decide,
        evolve=evolve,
        # Added v1 was `{"amount": n}`: lifted on read
        event_versions={"Added": 2},
        upcasters={("Added", 1): lambda d: {"n": d["amount"]}},
        state_version=state_version,
    )


AGGREGATE = make_tally()
