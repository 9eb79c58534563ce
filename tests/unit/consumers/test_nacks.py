"""The pure parts of nacks: the backoff, and which replayed or nacked records a fetch hands out."""

from __future__ import annotations

import pytest

from tributary.consumers.nacks import MAX_RETRY_BACKOFF_MS, SaidNo, backoff_ms, token
from tributary.log import Record

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("attempts", "base", "want"),
    [
        (1, 1000, 1000),
        (2, 1000, 2000),
        (4, 1000, 8000),
        (7, 1000, MAX_RETRY_BACKOFF_MS),
        (500, 1, MAX_RETRY_BACKOFF_MS),
    ],
)
def test_the_backoff_doubles_up_to_its_ceiling(attempts: int, base: int, want: int) -> None:
    assert backoff_ms(attempts, base) == want


def _rec(partition: int, offset: int) -> Record:
    return Record("t", partition, offset, 0, None, b"{}", None)


def test_replays_go_to_the_holder_once_and_again_where_delivery_restarted() -> None:
    me = token("m", 3)
    said = SaidNo(replays=[(_rec(0, 1), None), (_rec(0, 2), me), (_rec(1, 5), token("m", 2)), (_rec(2, 7), None)])
    held = {("t", 0), ("t", 1)}
    assert said.replays_for(me, restarted=set(), held=held) == [_rec(0, 1), _rec(1, 5)]
    assert said.replays_for(me, restarted={("t", 0)}, held=held) == [_rec(0, 1), _rec(0, 2), _rec(1, 5)]


def test_retried_names_the_nacked_records_a_fetch_delivered_again() -> None:
    said = SaidNo(pending={("t", 0, 4), ("t", 1, 9)})
    assert said.retried([_rec(0, 3), _rec(0, 4), _rec(0, 5)]) == [("t", 0, 4)]
