"""Where subjects' keys live: a small `KeyStore` contract, the service database by default.

A KMS plugs in by implementing `KeyStore` (its keys, or data keys it wraps); the event store only
ever asks for a subject's current key, for keys by (subject, kid), for a new version, and to destroy
a subject's keys. `DatabaseKeys` keeps them in `eventstore.subject_keys`, reached through a
connection factory (a pool's `connection`, or one connection per call from a DSN).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, Protocol

import psycopg

from tributary.eventstore.model import RecordedEvent
from tributary.eventstore.personal import KeyId, has_envelopes, reveal, sealed_keys

__all__ = [
    "DatabaseKeys",
    "Forgotten",
    "KeyStore",
    "forget_subject",
    "reveal_events",
    "reveal_events_keyed",
    "reveal_json",
    "reveal_values",
]

_KEY_BYTES = 32  # AES-256

_CURRENT = (
    "SELECT DISTINCT ON (subject_id) subject_id, kid, key FROM eventstore.subject_keys "
    "WHERE subject_id = ANY(%s) ORDER BY subject_id, kid DESC"
)
# A subject's next key: version 1, or one past its newest (a forgotten subject starts afresh).
_CREATE = (
    "INSERT INTO eventstore.subject_keys (subject_id, kid, key) "
    "SELECT s.subject_id, coalesce((SELECT max(kid) FROM eventstore.subject_keys k "
    "WHERE k.subject_id = s.subject_id), 0) + 1, s.key "
    "FROM unnest(%s::text[], %s::bytea[]) AS s(subject_id, key) "
    "ON CONFLICT (subject_id, kid) DO NOTHING"
)
_BY_IDS = (
    "SELECT k.subject_id, k.kid, k.key FROM eventstore.subject_keys k "
    "JOIN unnest(%s::text[], %s::int[]) AS w(subject_id, kid) USING (subject_id, kid) WHERE k.key IS NOT NULL"
)
_DESTROY = (
    "UPDATE eventstore.subject_keys SET key = NULL, destroyed_at = now() WHERE subject_id = %s AND key IS NOT NULL"
)
# The streams holding a value sealed for the subject (a scan: forgetting is rare).
_STREAMS = (
    "SELECT DISTINCT stream_id, stream_type FROM eventstore.events "
    "WHERE jsonb_path_exists(data, '$.* ? (@.\"$enc\" == \"v1\" && @.subject == $s)', jsonb_build_object('s', %s::text))"
)
# Its streams' snapshots, and any other snapshot whose state one of its keys revealed.
_DROP_SNAPSHOTS = (
    "DELETE FROM eventstore.snapshots "
    "WHERE stream_id = ANY(%s) OR key_ids @> jsonb_build_array(jsonb_build_array(%s::text))"
)

Connect = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]


class KeyStore(Protocol):
    """The keys personal data is sealed under; what a KMS implements to hold them instead."""

    def current(self, subjects: Collection[str]) -> dict[str, tuple[int, bytes]]:
        """Each subject's newest live key as (kid, key), made if it has none."""
        ...

    def keys(self, ids: Collection[KeyId]) -> dict[KeyId, bytes]:
        """The keys of these (subject, kid) that exist; destroyed or unknown ones are absent."""
        ...

    def rotate(self, subject: str) -> int:
        """A new key version for the subject (new events use it; older keys still read); its kid."""
        ...

    def destroy(self, subject: str) -> int:
        """Destroy every key of the subject; how many there were."""
        ...


class DatabaseKeys:
    """`KeyStore` on `eventstore.subject_keys`."""

    def __init__(self, connect: Connect) -> None:
        self._connect = connect

    @classmethod
    def from_dsn(cls, dsn: str) -> DatabaseKeys:
        return cls(lambda: psycopg.connect(dsn, autocommit=True))

    @classmethod
    def on(cls, conn: psycopg.Connection[Any]) -> DatabaseKeys:
        """On a connection the caller holds (a command's session: it never waits for a second one)."""
        return cls(lambda: nullcontext(conn))

    def current(self, subjects: Collection[str]) -> dict[str, tuple[int, bytes]]:
        wanted = sorted(set(subjects))
        if not wanted:
            return {}
        with self._connect() as conn:
            found = _live(conn.execute(_CURRENT, (wanted,)).fetchall())
            missing = [s for s in wanted if s not in found]
            if missing:  # two writers may race here: the key made first wins (ON CONFLICT), both read it
                conn.execute(_CREATE, (missing, [os.urandom(_KEY_BYTES) for _ in missing]))
                found |= _live(conn.execute(_CURRENT, (missing,)).fetchall())
        return found

    def keys(self, ids: Collection[KeyId]) -> dict[KeyId, bytes]:
        if not ids:
            return {}
        pairs = sorted(set(ids))
        with self._connect() as conn:
            rows = conn.execute(_BY_IDS, ([s for s, _ in pairs], [k for _, k in pairs])).fetchall()
        return {(r[0], int(r[1])): bytes(r[2]) for r in rows}

    def rotate(self, subject: str) -> int:
        with self._connect() as conn:
            conn.execute(_CREATE, ([subject], [os.urandom(_KEY_BYTES)]))
            row = conn.execute(_CURRENT, ([subject],)).fetchone()
        assert row is not None  # just made
        return int(row[1])

    def destroy(self, subject: str) -> int:
        with self._connect() as conn:
            return conn.execute(_DESTROY, (subject,)).rowcount


def _live(rows: list[Any]) -> dict[str, tuple[int, bytes]]:
    """Subjects whose newest key is live (a destroyed newest key: the subject needs a new one)."""
    return {r[0]: (int(r[1]), bytes(r[2])) for r in rows if r[2] is not None}


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What forgetting a subject did: keys destroyed, and the streams (with their types) whose
    events held its data, whose snapshots were deleted and whose projections need a rebuild."""

    subject: str
    keys: int
    streams: tuple[tuple[str, str], ...]

    @property
    def stream_types(self) -> set[str]:
        return {t for _, t in self.streams}


def forget_subject(keys: KeyStore, connect: Connect, subject: str) -> Forgotten:
    """Destroy the subject's keys, then delete the snapshots of its streams (a snapshot holds the
    folded state in plaintext; the next load folds the erased events instead)."""
    destroyed = keys.destroy(subject)
    with connect() as conn:
        streams = tuple((str(r[0]), str(r[1])) for r in conn.execute(_STREAMS, (subject,)).fetchall())
        conn.execute(_DROP_SNAPSHOTS, ([s for s, _ in streams], subject))
    return Forgotten(subject, destroyed, streams)


def _revealer(keys: KeyStore, datas: Iterable[object]) -> tuple[Callable[[Any], Any] | None, frozenset[KeyId]]:
    """One key lookup for every sealed value of `datas`: what reveals one data with those keys (None
    when nothing is sealed: no lookup at all), and the keys found (those that revealed something)."""
    wanted: set[KeyId] = set()
    for data in datas:
        wanted |= sealed_keys(data)
    if not wanted:
        return None, frozenset()
    found = keys.keys(wanted)
    return (lambda data: reveal(data, found.get)), frozenset(found)


def reveal_events(keys: KeyStore, events: list[RecordedEvent]) -> list[RecordedEvent]:
    """The events with their sealed fields revealed (or erased), fetching the keys in one call;
    events without personal data cost nothing."""
    return reveal_events_keyed(keys, events)[0]


def reveal_events_keyed(keys: KeyStore, events: list[RecordedEvent]) -> tuple[list[RecordedEvent], frozenset[KeyId]]:
    """`reveal_events`, and the keys that revealed plaintext (what a state folded from them depends on)."""
    open_, used = _revealer(keys, (e.data for e in events))
    if open_ is None:
        return events, used
    return [replace(e, data=open_(e.data)) if has_envelopes(e.data) else e for e in events], used


def reveal_json(keys: KeyStore, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`reveal_events` for events as the API shows them (a stored command answer)."""
    open_, _ = _revealer(keys, (e.get("data") for e in events))
    if open_ is None:
        return events
    return [{**e, "data": open_(e["data"])} for e in events]


def reveal_values(keys: KeyStore, topics: list[str], values: list[Any]) -> list[Any]:
    """Log record values (decoded JSON) with the personal data of `events.*` records revealed,
    one key lookup for the batch: what a projection's fold sees."""
    datas = [
        v.get("data") if t.startswith("events.") and isinstance(v, dict) else None
        for t, v in zip(topics, values, strict=True)
    ]
    open_, _ = _revealer(keys, datas)
    if open_ is None:
        return values
    return [{**v, "data": open_(d)} if has_envelopes(d) else v for v, d in zip(values, datas, strict=True)]
