"""The partition assignment: every partition to exactly one subscribed member, balanced, deterministic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.consumers import assign

pytestmark = pytest.mark.unit

TOPICS = ["a", "b", "c"]
members = st.dictionaries(
    st.text("mnopq", min_size=1, max_size=3), st.lists(st.sampled_from(TOPICS), min_size=1, max_size=3), max_size=6
)
counts = st.fixed_dictionaries({t: st.integers(0, 9) for t in TOPICS})


@given(members, counts)
def test_every_partition_goes_to_exactly_one_subscribed_member(
    subs: dict[str, list[str]], parts: dict[str, int]
) -> None:
    plan = assign(subs, parts)
    assert set(plan) == set(subs)
    held = [tp for tps in plan.values() for tp in tps]
    wanted = {(t, p) for t in {t for ts in subs.values() for t in ts} for p in range(parts[t])}
    assert sorted(held) == sorted(wanted)
    for member, tps in plan.items():
        assert all(t in subs[member] for t, _ in tps)
        assert tps == sorted(tps)


@given(st.integers(1, 7), counts)
def test_members_with_the_same_topics_differ_by_at_most_one(n: int, parts: dict[str, int]) -> None:
    plan = assign({f"m{i}": TOPICS for i in range(n)}, parts)
    sizes = [len(v) for v in plan.values()]
    assert max(sizes) - min(sizes) <= 1


@given(members, counts)
def test_the_same_input_in_any_order_gives_the_same_plan(subs: dict[str, list[str]], parts: dict[str, int]) -> None:
    shuffled = {m: list(reversed(subs[m])) for m in reversed(list(subs))}
    assert assign(shuffled, parts) == assign(subs, parts)


def test_a_topic_not_in_the_log_yet_assigns_nothing() -> None:
    assert assign({"m": ["later"]}, {}) == {"m": []}
