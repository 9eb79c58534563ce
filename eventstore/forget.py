"""Forgetting a data subject (crypto-shredding): destroy its keys, drop what holds its data in
plaintext, and name the projections to rebuild.

Events stay as they are (versions stay gapless, the log keeps its records): their sealed fields
read as erased from then on, everywhere. What held the revealed values must be renewed: snapshots
of the subject's streams are deleted here, and every projection reading those streams' topics
(`events.<stream_type>`) is rebuilt by the caller (the CLI waits for it, the API starts it).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from tributary.eventstore.keys import Forgotten, KeyStore, forget_subject
from tributary.eventstore.store import EventStore
from tributary.eventstore.values import check_id

__all__ = ["Forgotten", "forget", "projections_reading", "rotate"]


def forget(store: EventStore, subject: str) -> Forgotten:
    """Destroy the subject's keys and delete its streams' snapshots."""
    check_id("subject", subject)
    return forget_subject(store.keys, store.pool.connection, subject)


def rotate(keys: KeyStore, subject: str) -> int:
    """A new key version for the subject: new events are sealed under it, older ones still read."""
    return keys.rotate(subject)


def projections_reading(projections: Iterable[tuple[str, Collection[str]]], stream_types: Collection[str]) -> list[str]:
    """The names of the projections (name, topics) that read one of these stream types' topics."""
    wanted = {f"events.{t}" for t in stream_types}
    return sorted(name for name, topics in projections if wanted & set(topics))
