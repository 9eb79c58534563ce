"""An `AsyncConnection` that keeps its socket registered with the event loop between queries.

psycopg's `wait_async` registers the socket before every wait for the server and removes it after
(`add_reader`/`remove_reader`): under uvloop that is six `epoll_ctl` calls per query, three of them
failing (strace of the API under load: 13,907 for 2,316 point lookups), ≈25 µs of a ≈85 µs query on
this machine. Here a read wait leaves the socket registered for the next one. epoll is
level-triggered, so a readiness that nobody waits for (a notice, or the server closing an idle
connection) unregisters it: an idle connection never spins the loop.

Everything but a plain read wait (a write wait, a timeout) goes to psycopg's own `wait`, with the
socket unregistered first. The registration is dropped before anything can close the socket: on
`close()`, and whenever a wait ends in an error (libpq closes the socket of a lost connection
itself, and epoll then forgets the descriptor silently: each wait checks that libpq's socket is
still the registered one)."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from psycopg import AsyncConnection, errors
from psycopg.abc import PQGen
from psycopg.waiting import Ready, Wait

__all__ = ["KeepReaderConnection"]

RV = TypeVar("RV")


def _resumed(state: Wait, gen: PQGen[RV]) -> PQGen[RV]:
    """`gen`, already advanced to `state`, as a generator that yields `state` first."""
    try:
        while True:
            state = gen.send((yield state))
    except StopIteration as ex:
        return ex.value  # type: ignore[no-any-return]


def _wake(waiter: asyncio.Future[int], ready: int) -> None:
    if not waiter.done():
        waiter.set_result(ready)


class KeepReaderConnection(AsyncConnection[Any]):
    _waiter: asyncio.Future[int] | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _fd = -1  # the descriptor registered with `_loop`, or -1
    _since = 0.0  # when the current wait began (`_loop.time()`)
    _watch: asyncio.TimerHandle | None = None

    async def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        try:
            state = next(gen)
        except StopIteration as ex:
            return ex.value  # type: ignore[no-any-return]
        try:
            while state == Wait.R and timeout is None:
                fd = self.pgconn.socket  # raises once libpq has dropped the socket of a lost connection
                if fd != self._fd:
                    self._unregister()
                    self._loop = asyncio.get_running_loop()
                    self._loop.add_reader(fd, self._readable)
                    self._fd = fd
                loop = self._loop
                assert loop is not None
                self._waiter = waiter = loop.create_future()
                # As psycopg: a wait ends after `interval` anyway (here after `interval` to twice that:
                # one timer per connection, armed when none is, rather than one per wait). A quiet
                # interval also registers the socket anew: uvloop closes its poll handle on a socket
                # error (EPOLLERR) without telling.
                self._since = since = loop.time()
                if self._watch is None:
                    self._watch = loop.call_at(since + interval, self._watchdog, interval)
                try:
                    ready = await waiter
                finally:
                    self._waiter = None
                if not ready:
                    self._unregister()
                state = gen.send(ready)
        except StopIteration as ex:
            return ex.value  # type: ignore[no-any-return]
        except OSError as ex:  # as psycopg's wait_async: the socket is gone
            self._unregister()
            raise errors.OperationalError("connection socket closed") from ex
        except BaseException:
            self._unregister()
            raise
        self._unregister()
        return await super().wait(_resumed(state, gen), interval, timeout)

    def _watchdog(self, interval: float) -> None:
        """End a wait that has lasted `interval`; else check again when the current one will have."""
        self._watch = None
        waiter = self._waiter
        if waiter is None:
            return  # nobody waits: the next wait arms it again
        due = self._since + interval
        if self._loop.time() >= due:  # type: ignore[union-attr]
            _wake(waiter, Ready.NONE)
        else:
            self._watch = self._loop.call_at(due, self._watchdog, interval)  # type: ignore[union-attr]

    def _readable(self) -> None:
        waiter = self._waiter
        if waiter is None:  # nobody waits: stop listening until the next query (not from inside the
            self._loop.call_soon(self._unregister_idle)  # type: ignore[union-attr] # poll callback itself)
        else:
            _wake(waiter, Ready.R)

    def _unregister_idle(self) -> None:
        if self._waiter is None:
            self._unregister()

    def _unregister(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)  # type: ignore[union-attr]
            self._fd = -1

    async def close(self) -> None:
        self._unregister()
        await super().close()
