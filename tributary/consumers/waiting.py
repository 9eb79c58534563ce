"""Waking long polls and streams when the log's committed end moves, without busy-waiting.

One task per process re-reads the log's manifest (on Kafka: asks the cluster for the partitions' ends)
while anyone waits (and not at all otherwise): at
once when the manifest is replaced (the log's commit point; Linux inotify, `ManifestWatch`), and every
`interval_s` in any case (elsewhere, or while the log's directory does not exist yet, that poll is all
there is). A waiter sleeps on an event that the task sets when a committed end moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from tributary.consumers.dirwatch import ManifestWatch
from tributary.consumers.offsets import GroupView

__all__ = ["LogChanges"]

log = logging.getLogger(__name__)


class LogChanges:
    def __init__(self, view: GroupView, *, interval_s: float) -> None:
        self.view = view
        self.interval_s = interval_s
        self._event = asyncio.Event()
        self._waiters = 0
        self._task: asyncio.Task[None] | None = None
        self._poke = asyncio.Event()  # set by the manifest watch: re-read the manifest now
        root = getattr(view, "root", None)  # None on Kafka: no files to watch, the poll is all there is
        self.watch = ManifestWatch(root, self._poke.set) if root is not None else None
        self.closed = False  # set when the server stops: streams end instead of waiting on

    async def wait(self, seen: int, timeout_s: float) -> bool:
        """Until the log view's version is past `seen` (True) or `timeout_s` passed (False)."""
        if self.view.version != seen or self.closed:
            return True
        event = self._event
        self._waiters += 1
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._watch(), name="log-changes")
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout_s)
        finally:
            self._waiters -= 1
        return self.view.version != seen

    async def _watch(self) -> None:
        failure = None
        while self._waiters > 0:
            if self.watch is not None:
                self.watch.ensure()
            self._poke.clear()  # before the read: a commit during it wakes the next round at once
            try:
                changed = await asyncio.to_thread(self.view.refresh)
                failure = None
            except Exception as exc:  # noqa: BLE001 - waiters time out and see the error on their next fetch
                if repr(exc) != failure:  # once per distinct failure, not every poll
                    log.warning(
                        "reading the log's manifest failed (retrying): %s",
                        (str(exc) or type(exc).__name__).splitlines()[0],
                    )
                failure, changed = repr(exc), False
            if changed:
                event, self._event = self._event, asyncio.Event()
                event.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poke.wait(), self.interval_s)

    def end_waits(self) -> None:
        """Wake every waiter now and for good (the server is stopping)."""
        self.closed = True
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def close(self) -> None:
        self.end_waits()
        if self.watch is not None:
            self.watch.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
