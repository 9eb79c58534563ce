"""An `Aggregate` checks its definition when it is built: each broken rule is one line naming it."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from tests.domains import tally
from tributary.eventstore.aggregate import Aggregate
from tributary.eventstore.errors import AggregateDefinitionError

pytestmark = pytest.mark.unit


class NoDefault(BaseModel):
    total: int


def build(**change: Any) -> Aggregate[Any]:
    fields: dict[str, Any] = {
        "stream_type": "tally",
        "state_type": tally.Tally,
        "commands": {"add": tally.Add, "close": tally.Close},
        "events": [tally.Added, tally.Closed],
        "decide": tally.decide,
        "evolve": lambda s, e: s,
    }
    return Aggregate(**{**fields, **change})


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"stream_type": "two words"}, "stream_type 'two words'"),
        ({"stream_type": ""}, "stream_type ''"),
        ({"state_type": dict}, "state_type must be a pydantic model"),
        ({"state_type": NoDefault}, "NoDefault needs a default for every field"),
        ({"decide": None}, "decide must be a function"),
        ({"evolve": "evolve"}, "evolve must be a function"),
        ({"state_version": 0}, "state_version must be an integer ≥ 1, not 0"),
        ({"state_version": "2"}, "state_version must be an integer ≥ 1, not '2'"),
        ({"state_version": True}, "state_version must be an integer ≥ 1, not True"),
        ({"commands": {}}, "commands must be a non-empty mapping"),
        ({"commands": {"add": dict}}, "command 'add' must be a pydantic model"),
        ({"commands": {"a b": tally.Add}}, "command name 'a b'"),
        ({"events": []}, "at least one event model"),
        ({"events": [tally.Added, tally.Added]}, "two events are named 'Added'"),
        ({"events": {"Plus": tally.Added}}, "event 'Plus' is keyed by another name than its class Added"),
        ({"events": [tally.Added, 3]}, "must be a pydantic model class"),
        ({"event_versions": {"Removed": 2}}, "event_versions names 'Removed', which has no model"),
        ({"event_versions": {"Added": 0}}, "event_versions['Added'] must be an integer ≥ 1"),
        ({"upcasters": {("Removed", 1): dict}}, "an upcaster names event 'Removed', which has no model"),
        ({"upcasters": {("Added", 1): dict}}, "upcaster ('Added', 1) lifts no version below Added's current"),
        (
            {"event_versions": {"Added": 3}, "upcasters": {("Added", 1): dict}},
            "Added is at schema version 3 but has no upcaster from v2",
        ),
    ],
)
def test_a_broken_definition_is_refused_in_one_line(change: dict[str, Any], words: str) -> None:
    with pytest.raises(AggregateDefinitionError) as refused:
        build(**change)
    message = str(refused.value)
    assert words in message and "\n" not in message, message


def test_a_sound_definition_keeps_its_parts() -> None:
    agg = build(event_versions={"Added": 2}, upcasters={("Added", 1): lambda d: {"n": d["amount"]}}, state_version=3)
    assert agg.event_models == {"Added": tally.Added, "Closed": tally.Closed}
    assert agg.state_version == 3 and agg.initial() == tally.Tally()
    assert agg.load_event("Added", 1, {"amount": 4}) == tally.Added(n=4)


def test_decide_returning_a_foreign_event_names_it() -> None:
    class Stray(BaseModel):
        pass

    with pytest.raises(TypeError, match="decide returned a Stray, which is not one of its events"):
        tally.AGGREGATE.event_type(Stray())
