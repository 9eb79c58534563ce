"""A member's server-side filter on event topics (pure)."""

from __future__ import annotations

import orjson
import pytest

from tributary.consumers.filters import EventFilter
from tributary.log import Record

pytestmark = pytest.mark.unit


def _event(stream: str, type_: str) -> Record:
    return Record("events.account", 0, 0, 0, orjson.dumps(stream), orjson.dumps({"type": type_}), None)


@pytest.mark.parametrize(
    ("types", "prefix", "stream", "type_", "kept"),
    [
        (["Deposited"], None, "a1", "Deposited", True),
        (["Deposited"], None, "a1", "Opened", False),
        (None, "acct-", "acct-7", "Opened", True),
        (None, "acct-", "user-7", "Opened", False),
        (["Opened", "Closed"], "acct-", "acct-7", "Closed", True),
        (["Opened", "Closed"], "acct-", "user-7", "Closed", False),
    ],
)
def test_an_event_is_kept_when_it_matches_every_part(
    types: list[str] | None, prefix: str | None, stream: str, type_: str, kept: bool
) -> None:
    f = EventFilter.for_topics(["events.account"], types, prefix)
    assert f is not None and f.matches(_event(stream, type_)) is kept
    assert EventFilter.from_json(f.to_json()) == f  # as the member's row keeps it


def test_no_filter_and_non_event_topics() -> None:
    assert EventFilter.for_topics(["shop.public.items"], None, None) is None
    mixed = EventFilter.for_topics(["events.account", "shop.public.items"], ["Opened"], None)
    assert mixed is not None  # it applies to the event topic; the other topic's records pass as they are
    row = Record("shop.public.items", 0, 0, 0, orjson.dumps({"id": 1}), orjson.dumps({"op": "c"}), None)
    assert mixed.matches(row)
    tombstone = Record("events.account", 0, 0, 0, orjson.dumps("a1"), None, None)
    assert not EventFilter(frozenset({"Opened"})).matches(tombstone)
