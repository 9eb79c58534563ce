"""What one client may hold of the server: a request's head and body, a connection slot, the requests
it may pipeline and the time it may take to send a request or read a response.

Connections are guarded below the HTTP parser: `GuardedH11` (or `GuardedHttpTools`, `[api] http`) wraps
uvicorn's protocol through the `asyncio.Protocol` and `asyncio.Transport` interfaces only (it forwards
every call and reads nothing of the inner protocol; httptools' parser callbacks tell it where heads end),
and `front.Front`, the app's ASGI layer, tells the guard when a connection's request reached the app
and when its response ended (and answers 413 and 431 from a request's head). Uvicorn has no public option for either: its keep-alive timer starts only
after a response, and every received byte cancels it (uvicorn issue #157).
"""

from __future__ import annotations

import asyncio
import functools
import resource
from collections.abc import Callable
from typing import Any, cast

from starlette.types import Message

from tributary.api.http.problems import MEDIA_TYPE, code_for_status, encode, problem_body

__all__ = [
    "Connection",
    "ConnectionGuard",
    "GuardedH11",
    "GuardedHttpTools",
    "connections",
    "head_too_large",
    "refusal",
]


_TIMEOUT_BODY = encode(problem_body(408, "request_timeout", "the request did not arrive in time; send it at once"))
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: %b\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%b"
    % (MEDIA_TYPE.encode(), len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)
# File descriptors kept free of client connections: the database pools, the log, Spark's sockets.
_RESERVED_FDS = 64


class ConnectionGuard:
    """The client connections of one server process.

    - A connection must deliver a request head within `timeout_s` of connecting or of its previous
      response (a trickling client gets 408 and is closed, a silent one is closed).
    - A response the client does not read must drain within `timeout_s` (writing stays paused
      past the transport's high-water mark; the connection is aborted).
    - At most `max_connections` are open (capped below the open-files limit): at the limit a new
      connection closes the one that has waited longest for a request; if every one is serving a
      request, the new one is closed.

    One per process, module-level: uvicorn builds protocols from a class, which `serve --workers`
    pickles into each worker; `create_app` configures each process's guard from its settings."""

    def __init__(self) -> None:
        self.timeout_s = 10.0
        self.max_connections = 1000
        self.max_header_bytes = 16_384
        self.max_body_bytes = 1_048_576
        self.open: dict[tuple[str, int], Connection] = {}  # by peer, in accept order

    def configure(
        self,
        *,
        timeout_s: float,
        max_connections: int,
        max_header_bytes: int = 16_384,
        max_body_bytes: int = 1_048_576,
    ) -> None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        cap = max(1, soft - _RESERVED_FDS) if soft != resource.RLIM_INFINITY else max_connections
        self.timeout_s = timeout_s
        self.max_connections = min(max_connections, cap)
        self.max_header_bytes = max_header_bytes
        self.max_body_bytes = max_body_bytes

    def admit(self, conn: Connection) -> bool:
        """Register a new connection; False when it must be closed (every slot serves a request)."""
        while len(self.open) >= self.max_connections:
            idle = next((c for c in self.open.values() if c.busy == 0), None)
            if idle is None:
                return False
            idle.drop()
        self.open[conn.peer] = conn
        return True

    def forget(self, conn: Connection) -> None:
        if self.open.get(conn.peer) is conn:
            del self.open[conn.peer]


connections = ConnectionGuard()


class Connection:
    """One client connection's deadline: armed while it owes the server a request or cannot take a
    response, cancelled while a request is in the app."""

    def __init__(self, transport: asyncio.Transport, guard: ConnectionGuard) -> None:
        self.transport = transport
        self.guard = guard
        peer = transport.get_extra_info("peername")
        self.peer: tuple[str, int] = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else ("", id(self))
        self.busy = 0  # requests in the app
        self.started = 0  # requests that reached the app, ever
        self.awaiting_body = False  # the app waits for more of its request's body
        self.wake: Callable[[], None] | None = None  # the app left the connection idle, or waits for a body
        self.received = 0  # bytes since the deadline was armed
        self.write_paused = False
        self.timer: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()

    def arm(self) -> None:
        self.disarm()
        self.received = 0
        self.timer = self.loop.call_later(self.guard.timeout_s, self.expire)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def request_started(self) -> None:
        self.busy += 1
        self.started += 1
        if not self.write_paused:
            self.disarm()

    def body_wanted(self, wanted: bool) -> None:
        """The app waits (or no longer waits) for more of the request's body."""
        self.awaiting_body = wanted
        if wanted and self.wake is not None:
            self.wake()

    def request_done(self) -> None:
        self.busy -= 1
        if self.busy == 0:
            self.arm()
            if self.wake is not None:
                self.wake()

    def expire(self) -> None:
        self.timer = None
        if self.transport.is_closing():
            return
        if self.busy == 0 and not self.write_paused and self.received:
            self.transport.write(_TIMEOUT_RESPONSE)
            self.transport.close()
            self.loop.call_later(1.0, self.transport.abort)  # a client that does not read the 408 either
        else:
            self.transport.abort()

    def drop(self) -> None:
        self.guard.forget(self)
        self.disarm()
        self.transport.abort()


class _Guarded(asyncio.Protocol):
    """An HTTP protocol of uvicorn's under the process's `ConnectionGuard` (a subclass is passed as
    uvicorn's `http`): every `asyncio.Protocol` call is forwarded, the constructor's arguments too."""

    def _inner(self, *args: Any, **kwargs: Any) -> asyncio.Protocol:
        raise NotImplementedError

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.inner = self._inner(*args, **kwargs)
        self.conn: Connection | None = None

    def _seen_by_inner(self, transport: asyncio.Transport) -> asyncio.Transport:
        """The transport the inner protocol is given."""
        return transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports implement asyncio.Transport without subclassing it)
        transport = cast(asyncio.Transport, transport)
        self.inner.connection_made(self._seen_by_inner(transport))
        conn = self.conn = Connection(transport, connections)
        if connections.admit(conn):
            conn.arm()
        else:
            transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.conn is not None:
            self.conn.received += len(data)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.conn.disarm()
            connections.forget(self.conn)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.conn is not None:
            self.conn.write_paused = True
            self.conn.arm()
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.conn is not None:
            self.conn.write_paused = False
            if self.conn.busy:
                self.conn.disarm()
        self.inner.resume_writing()


def head_too_large(limit: int) -> str:
    """`detail` of the 431 of a head past `[api] max_header_bytes`."""
    return f"request headers larger than {limit} bytes ([api] max_header_bytes); send fewer or shorter headers"


def refusal(status: int, detail: str, *, close: bool = False) -> tuple[Message, Message]:
    """The two ASGI messages of a problem answered before the app (413, 431); `close` ends the
    connection after it."""
    body = encode(problem_body(status, code_for_status(status), detail))
    headers = [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    return (
        {"type": "http.response.start", "status": status, "headers": headers},
        {"type": "http.response.body", "body": body},
    )


class GuardedH11(_Guarded):
    """h11 under the guard: the parser that bounds a connection. It stops reading while a response is
    pending (pipelined requests wait in the socket) and refuses a head that grows past
    `h11_max_incomplete_event_size` while it arrives (400)."""

    def _inner(self, *args: Any, **kwargs: Any) -> asyncio.Protocol:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol(*args, **kwargs)


SLICE_BYTES = 4096  # what httptools is handed at once: it parses all of it, queueing every request in it


@functools.cache
def _observed_httptools() -> type[Any]:
    """uvicorn's httptools protocol, telling its guard where its parser is. httptools calls these
    methods (its callback protocol, `httptools.parser.protocol.HTTPProtocol`) on the object it parses
    for, so the guard learns a head's end, a piece of body and a message's end as the parser does."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Observed(HttpToolsProtocol):
        guarded: GuardedHttpTools

        def on_headers_complete(self) -> None:
            self.guarded.parsed(head=True)
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            self.guarded.parsed()
            super().on_body(body)

        def on_message_complete(self) -> None:
            self.guarded.parsed()
            super().on_message_complete()

    return Observed


class GuardedHttpTools(_Guarded):
    """httptools under the guard, bounded as h11 is.

    uvicorn's httptools protocol parses all it is handed: it queues every pipelined request of a read
    (pausing the transport only after it) and takes a head of any size. So the guard hands it a read
    in slices of `SLICE_BYTES`, keeps the rest while it has paused reading (a pipelined request
    waits, or a body it has not passed on) and hands that over once the requests it queued have left
    the app. The parser tells the guard (`parsed`) where a head ends, where a body goes on and where
    a message ends; bytes it takes without any of these (a head, or a chunked body's trailer) are
    bounded by `max_header_bytes` at the end of a read: past it, while no request is in the app, the
    connection gets 431 and is closed (h11's bound); while one is, reading waits until it left. A body's
    bytes are the app's to bound (413): once answered, the parser reads past the rest of it."""

    def _inner(self, *args: Any, **kwargs: Any) -> asyncio.Protocol:
        self.held = b""  # received, not yet handed over (the inner protocol paused reading)
        self.inner_paused = False  # the inner protocol paused reading
        self.real_paused = False  # the transport's reading is paused (by the guard, for the inner protocol)
        self.waking = False  # `_resume` is scheduled
        self.heads = 0  # heads parsed
        self.progressed = False  # the parser reported a head's end, body or message end in the current slice
        self.quiet = 0  # bytes parsed since the parser last reported one of those
        inner = _observed_httptools()(*args, **kwargs)
        inner.guarded = self
        return cast(asyncio.Protocol, inner)

    def _seen_by_inner(self, transport: asyncio.Transport) -> asyncio.Transport:
        self.transport = transport
        return cast(asyncio.Transport, _ReadingPausedBy(transport, self))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.conn is not None:
            self.conn.wake = self.wake

    def data_received(self, data: bytes) -> None:
        if self.conn is not None:
            self.conn.received += len(data)
        if self.held or self.inner_paused:
            self.held += data
            return
        self._hand_over(data)

    def parsed(self, *, head: bool = False) -> None:
        """The parser reached a head's end (`head`), a piece of body or a message's end."""
        self.progressed = True
        self.heads += head

    def _hand_over(self, data: bytes) -> None:
        """Hand `data` to the inner protocol a slice at a time while it reads; keep the rest. Then
        bound what its parser took without progress."""
        pos = 0
        while pos < len(data):
            if self.inner_paused or self.transport.is_closing():
                self.held = data[pos:]
                return
            piece = data[pos : pos + SLICE_BYTES]
            pos += len(piece)
            self.progressed = False
            self.inner.data_received(piece)
            self.quiet = 0 if self.progressed else self.quiet + len(piece)
        self.held = b""
        self._bound_head()

    def _bound_head(self) -> None:
        """At the end of what was handed over (a read, or what was held), when the parser took more
        than `max_header_bytes` without reaching a head's end, body or message end (as h11 refuses a
        head still incomplete past its limit; a head whole in one read goes on, to the app's 431 for
        its headers): 431 and closed when no request is in the app, else reading waits until none is
        (a response may be under way)."""
        conn = self.conn
        guard = conn.guard if conn is not None else connections
        if self.quiet <= guard.max_header_bytes or self.transport.is_closing():
            return
        if conn is not None and conn.busy:
            if not self.real_paused:
                self.real_paused = True
                self.transport.pause_reading()
        else:
            self._refuse_head(guard.max_header_bytes)

    def _refuse_head(self, limit: int) -> None:
        start, body = refusal(431, head_too_large(limit), close=True)
        lines = [b"HTTP/1.1 431 Request Header Fields Too Large"]
        lines += [name + b": " + value for name, value in start["headers"]]
        self.transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + body["body"])
        self.transport.close()
        self.held = b""

    def reading_paused(self) -> None:
        self.inner_paused = True
        if not self.real_paused:
            self.real_paused = True
            self.transport.pause_reading()

    def reading_resumed(self) -> None:
        self.inner_paused = False
        self.wake()

    def wake(self) -> None:
        """The inner protocol reads again, the app waits for a request's body, or the app has no
        request of the connection left: hand over what was held and resume reading, on the next
        loop turn (not inside the inner protocol's call)."""
        if (self.held or self.real_paused) and not self.waking:
            self.waking = True
            asyncio.get_running_loop().call_soon(self._resume)

    def _resume(self) -> None:
        """Hand over what was held and resume reading, unless the inner protocol paused again or a
        request is in it or in the app: the inner protocol resumes reading after every response, with
        pipelined requests still queued; each of them reaches the app, and the last one's end wakes
        this again. While the app waits for a body, the body goes over."""
        self.waking = False
        conn = self.conn
        if self.inner_paused or self.transport.is_closing():
            return
        if conn is not None and not conn.awaiting_body and (conn.busy or self.heads > conn.started):
            return
        held, self.held = self.held, b""
        self._hand_over(held)
        if self.real_paused and not (self.inner_paused or self.held or self.transport.is_closing()):
            if self.quiet > (conn.guard if conn is not None else connections).max_header_bytes:
                return  # (a head past the bound waits for the app to finish)
            self.real_paused = False
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.held = b""
        super().connection_lost(exc)


class _ReadingPausedBy:
    """The transport as the inner protocol sees it: every call forwarded, but pausing and resuming
    reading go through the guard (which holds what the inner protocol has not taken yet)."""

    def __init__(self, transport: asyncio.Transport, guarded: GuardedHttpTools) -> None:
        self._transport = transport
        self._guarded = guarded

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def pause_reading(self) -> None:
        self._guarded.reading_paused()

    def resume_reading(self) -> None:
        self._guarded.reading_resumed()
