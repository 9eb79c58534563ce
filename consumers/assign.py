"""Dividing a group's partitions among its live members: a pure, deterministic function.

Every topic-partition goes to exactly one member subscribed to its topic; members subscribed to the
same topics get counts that differ by at most one. Partitions are taken in (topic, partition) order and
each goes to the subscribed member holding the fewest so far, ties broken by member id — Kafka's
round-robin assignor, generalised to members with different subscriptions. The same members and
partition counts always give the same assignment, in every process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["TopicPartition", "assign"]

TopicPartition = tuple[str, int]


def assign(
    subscriptions: Mapping[str, Sequence[str]], partitions: Mapping[str, int]
) -> dict[str, list[TopicPartition]]:
    """`subscriptions`: member id → topics; `partitions`: topic → partition count (a topic not in the
    log yet has 0). Returns member id → its topic-partitions, sorted; every member appears."""
    out: dict[str, list[TopicPartition]] = {m: [] for m in sorted(subscriptions)}
    members_of: dict[str, list[str]] = {}
    for member in sorted(subscriptions):
        for topic in set(subscriptions[member]):
            members_of.setdefault(topic, []).append(member)
    for topic in sorted(members_of):
        candidates = members_of[topic]
        for partition in range(partitions.get(topic, 0)):
            chosen = min(candidates, key=lambda m: (len(out[m]), m))
            out[chosen].append((topic, partition))
    return out
