"""Waking long polls and streams when the log's committed end moves, without busy-waiting.

One task per process re-reads the log's manifest (on Kafka: asks the cluster for the partitions' ends)
while anyone waits (and not at all otherwise), at once when the manifest is replaced (the log's commit
point; Linux inotify, `ManifestWatch`). While that watch is active, a safety re-read runs only every
`watched_interval_s` (1 s); without it (elsewhere than Linux, on Kafka, while the log's directory does not
exist yet, or once the watch missed a change, as on file systems that do not report changes) the task
re-reads every `interval_s`. A waiter sleeps on an event that the task sets when a committed end moved.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from tributary.consumers.dirwatch import ManifestWatch
from tributary.consumers.offsets import GroupView

__all__ = ["LogChanges"]

log = logging.getLogger(__name__)

WATCHED_INTERVAL_S = 1.0  # the safety re-read while inotify reports the manifest's replacements


class LogChanges:
    def __init__(self, view: GroupView, *, interval_s: float, watched_interval_s: float = WATCHED_INTERVAL_S) -> None:
        self.view = view
        self.interval_s = interval_s
        self.watched_interval_s = max(watched_interval_s, interval_s)
        self._event = asyncio.Event()
        self._waiters = 0
        self._task: asyncio.Task[None] | None = None
        self._poke = asyncio.Event()  # set by the manifest watch: re-read the manifest now
        self._pokes = 0  # how many times the watch reported a change
        root = view.root  # None on Kafka: no files to watch, the poll is all there is
        self.watch = ManifestWatch(root, self._poked) if root is not None else None
        self.trusted = True  # False once the watch missed a change: poll every interval_s from then on
        self.reads = 0  # manifest re-reads (for tests and diagnostics)
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

    def _poked(self) -> None:
        self._pokes += 1
        self._poke.set()

    def watching(self) -> bool:
        """True while the watch reports the manifest's replacements (the safety re-read is slow then)."""
        return self.watch is not None and self.trusted and self.watch.active

    async def _watch(self) -> None:
        failure = None
        timed_out = False  # this round runs because the last wait ended without a poke
        watched = False  # the watch was active during the whole last wait
        pokes_before = 0  # the watch's count of changes when the last round's read started
        version = self.view.version
        while self._waiters > 0:
            if self.watch is not None and self.trusted:
                self.watch.ensure()
            pokes = self._pokes
            self._poke.clear()  # before the read: a commit during it wakes the next round at once
            try:
                changed = await asyncio.to_thread(self.view.refresh)
                self.reads += 1
                failure = None
            except Exception as exc:  # noqa: BLE001 - waiters time out and see the error on their next fetch
                if repr(exc) != failure:  # once per distinct failure, not every poll
                    log.warning(
                        "reading the log's manifest failed (retrying): %s",
                        (str(exc) or type(exc).__name__).splitlines()[0],
                    )
                failure, changed = repr(exc), False
            if self.view.version != version:  # (a fetch's own refresh may have seen the change first)
                version = self.view.version
                event, self._event = self._event, asyncio.Event()
                event.set()
            if changed and timed_out and watched and self._pokes == pokes_before:
                await self._check_missed(pokes_before)
            pokes_before = pokes
            watched = self.watching()
            try:
                await asyncio.wait_for(self._poke.wait(), self.watched_interval_s if watched else self.interval_s)
                timed_out = False
            except TimeoutError:
                timed_out = True

    async def _check_missed(self, pokes: int) -> None:
        """The safety re-read found a change the watch did not report (yet): give its event a moment to
        arrive, then stop relying on the watch (e.g. a network file system that reports nothing)."""
        await asyncio.sleep(0.05)
        if self._pokes == pokes and self.trusted:
            self.trusted = False
            log.info(
                "the log's directory did not report a change of its manifest (a network file system?): "
                "re-reading it every %g ms while anyone waits",
                self.interval_s * 1000,
            )

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
