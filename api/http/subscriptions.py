"""Catch-up subscriptions to `$all` (or one stream type) for server-sent events.

One poller per process asks the database, every `poll_s` while anyone is subscribed, for the
position of the last event a reader could be given (`EventStore.head_position`'s statement: one
index probe). When it moves, every waiting subscriber wakes and reads its next page itself, from
its own position, through the gap-safe `$all` statement.

Why polling and not LISTEN/NOTIFY: a NOTIFY per append would take PostgreSQL's notification
queue lock at every commit, so appends would pay for subscribers; and a notification arrives at
commit, while the gap-safe read may have to hold an event back until older transactions finish,
so a subscriber would poll anyway. One cheap query per interval per process costs appends nothing.

Backpressure: a subscriber holds at most one page; it reads the next only after the previous one
was handed to the connection, so a slow client waits on its own socket (and the connection guard
closes it if it stops reading), never slowing appends or other subscribers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable
from types import FrameType
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from tributary.eventstore.errors import StoreUnavailable, UnknownPosition
from tributary.eventstore.keys import KeyStore, reveal_events
from tributary.eventstore.model import RecordedEvent, dumps, event_json
from tributary.eventstore.personal import has_envelopes
from tributary.eventstore.statements import READ_ALL_HEAD
from tributary.eventstore.store import position_exists_statement, read_all_statement, recorded_event

__all__ = ["AllFilter", "Subscriptions", "sse_event"]

AllFilter = tuple[str | None, tuple[str, ...] | None]
"""A server-side filter of `$all`: (stream id prefix, event types), either None for any."""

log = logging.getLogger(__name__)


def sse_event(event: RecordedEvent) -> bytes:
    """One server-sent event: id = the global position, data = the event as the API shows it."""
    return b"id: %d\ndata: %b\n\n" % (event.position, dumps(event_json(event)))


class Subscriptions:
    """The subscriptions of one process: a shared poller and each subscriber's own reads."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        *,
        poll_s: float = 0.1,
        page: int = 100,
        keepalive_s: float = 15.0,
        keys: KeyStore | None = None,
    ) -> None:
        self.pool = pool
        self.keys = keys  # reveals personal data (docs/eventstore.md, "Personal data"); None: events as stored
        self.poll_s, self.page, self.keepalive_s = poll_s, page, keepalive_s
        self._moved = asyncio.Event()  # replaced at each move: a waiter holds the one it read before
        self._subscribers = 0
        self._poller: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()

    async def read(
        self, after: int, limit: int, stream_type: str | None, only: AllFilter | None = None
    ) -> list[RecordedEvent]:
        """A page of `$all` (or of `stream_type`'s events) after `after`, filtered in SQL by `only`:
        `EventStore.read_all`."""
        prefix, types = only if only is not None else (None, None)
        query, params = read_all_statement(
            after=after, limit=limit, stream_type=stream_type, stream_prefix=prefix, event_types=types
        )
        try:
            async with self.pool.connection() as conn:
                rows = await (await conn.execute(query, params)).fetchall()
                if not rows and after > 0:
                    exists = await (await conn.execute(*position_exists_statement(after))).fetchone()
                    if exists is None or not exists[0]:
                        raise UnknownPosition(after)
        except psycopg.OperationalError as exc:  # refused, lost, or no pooled connection in time
            raise StoreUnavailable(
                f"the service database did not answer ({type(exc).__name__}); retry the request"
            ) from exc
        events = [recorded_event(r) for r in rows]
        if self.keys is not None and any(has_envelopes(e.data) for e in events):
            return await asyncio.to_thread(reveal_events, self.keys, events)
        return events

    async def follow(self, after: int, stream_type: str | None, only: AllFilter | None = None) -> AsyncIterator[bytes]:
        """The SSE body: a `retry` hint, then pages of events as they become readable, and a
        comment line every `keepalive_s` of silence (proxies keep the connection open)."""
        self._subscribers += 1
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll())
        try:
            yield b"retry: 1000\n\n"
            while not self._closed.is_set():
                moved = self._moved
                try:
                    page = await self.read(after, self.page, stream_type, only)
                except StoreUnavailable:  # end the stream: the client comes back after `retry`
                    log.warning("subscriptions: the service database did not answer; a stream ended")
                    return
                if page:
                    yield b"".join(sse_event(e) for e in page)
                    after = page[-1].position
                    if len(page) == self.page:
                        continue
                try:
                    await asyncio.wait_for(moved.wait(), self.keepalive_s)
                except TimeoutError:
                    yield b": keep-alive\n\n"
        finally:
            self._subscribers -= 1

    async def _poll(self) -> None:
        head = -1
        while self._subscribers > 0 and not self._closed.is_set():
            try:
                async with self.pool.connection() as conn:
                    row = await (await conn.execute(READ_ALL_HEAD)).fetchone()
                now = 0 if row is None else int(row[0])
            except psycopg.Error:  # the database is away: subscribers wait; the next poll tries again
                log.warning("subscriptions: cannot read the head position", exc_info=True)
                now = head
            if now != head:
                head = now
                self._moved.set()
                self._moved = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closed.wait(), self.poll_s)

    def end_on_exit_signals(self) -> None:
        """End every subscription as soon as the server is told to stop (SIGTERM, SIGINT), then let
        the server's own handler run: uvicorn waits for open responses to finish before it shuts
        the app down, and a subscription would never finish by itself. Chains the handler in place
        (`signal.getsignal`); outside the main thread (an embedded server) there is none to chain."""
        loop = asyncio.get_running_loop()

        def end() -> None:
            self._closed.set()
            self._moved.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            if not callable(previous):
                continue

            def handler(signum: int, frame: FrameType | None, previous: Callable[..., Any] = previous) -> None:
                loop.call_soon_threadsafe(end)
                previous(signum, frame)

            try:
                signal.signal(sig, handler)
            except ValueError:  # not the main thread
                return

    async def close(self) -> None:
        """End every subscription (their streams finish) and the poller."""
        self._closed.set()
        self._moved.set()
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
