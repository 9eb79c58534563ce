"""`tributary serve`'s background scavenge: every `[eventstore] scavenge_interval_s` (0 = off), the
store removes what stream metadata and deletes hide, in short transactions on a worker thread, so
neither the event loop nor appends wait for it."""

from __future__ import annotations

import asyncio
import logging

from tributary.eventstore.errors import EventStoreError
from tributary.eventstore.store import EventStore

__all__ = ["start_scavenger"]

log = logging.getLogger("tributary.api")


async def _scavenge_every(store: EventStore, interval_s: float, keep_s: float) -> None:
    """Scavenge (and forget positions removed over `keep_s` ago), then wait the interval, until
    cancelled; a failed round is logged and retried."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            removed = await asyncio.to_thread(store.scavenge)
            pruned = await asyncio.to_thread(store.prune_removed, keep_s)
        except EventStoreError as exc:
            log.warning("scavenge failed (retried in %ss): %s", interval_s, exc)
            continue
        if removed or pruned:
            log.info("scavenge: %d event(s) removed, %d old position(s) forgotten", removed, pruned)


def start_scavenger(store: EventStore, interval_s: float, keep_s: float = 604_800) -> asyncio.Task[None] | None:
    """The background scavenge's task, or None when the interval is 0 (off)."""
    if interval_s <= 0:
        return None
    return asyncio.get_running_loop().create_task(_scavenge_every(store, interval_s, keep_s), name="scavenge")
