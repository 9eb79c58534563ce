"""What one client may hold of the server: a request body (413 past `max_bytes`), a connection slot and
the time it may take to send a request or read a response.

Connections are guarded below the HTTP parser: `GuardedH11` (or `GuardedHttpTools`, `[api] http`) wraps
uvicorn's protocol through the `asyncio.Protocol` interface only (it forwards every call and reads
nothing of the inner protocol),
and `RequestTracker`, an ASGI middleware, tells the guard when a connection's request reached the app
and when its response ended. Uvicorn has no public option for either: its keep-alive timer starts only
after a response, and every received byte cancels it (uvicorn issue #157).
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any, cast

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tributary.api.http.problems import MEDIA_TYPE, encode, problem_body

__all__ = ["BodyLimit", "ConnectionGuard", "GuardedH11", "GuardedHttpTools", "RequestTracker", "connections"]


class BodyLimit:
    """ASGI middleware: refuse bodies over `max_bytes` (by Content-Length, and while streaming)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers", [])).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._too_large(send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._too_large(send)

    async def _too_large(self, send: Send) -> None:
        detail = f"request body larger than {self.max_bytes} bytes ([api] max_body_bytes)"
        body = encode(problem_body(413, "body_too_large", detail))
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    pass


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
        self.open: dict[tuple[str, int], _Connection] = {}  # by peer, in accept order

    def configure(self, *, timeout_s: float, max_connections: int) -> None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        cap = max(1, soft - _RESERVED_FDS) if soft != resource.RLIM_INFINITY else max_connections
        self.timeout_s = timeout_s
        self.max_connections = min(max_connections, cap)

    def admit(self, conn: _Connection) -> bool:
        """Register a new connection; False when it must be closed (every slot serves a request)."""
        while len(self.open) >= self.max_connections:
            idle = next((c for c in self.open.values() if c.busy == 0), None)
            if idle is None:
                return False
            idle.drop()
        self.open[conn.peer] = conn
        return True

    def forget(self, conn: _Connection) -> None:
        if self.open.get(conn.peer) is conn:
            del self.open[conn.peer]


connections = ConnectionGuard()


class _Connection:
    """One client connection's deadline: armed while it owes the server a request or cannot take a
    response, cancelled while a request is in the app."""

    def __init__(self, transport: asyncio.Transport, guard: ConnectionGuard) -> None:
        self.transport = transport
        self.guard = guard
        peer = transport.get_extra_info("peername")
        self.peer: tuple[str, int] = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else ("", id(self))
        self.busy = 0  # requests in the app
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
        if not self.write_paused:
            self.disarm()

    def request_done(self) -> None:
        self.busy -= 1
        if self.busy == 0:
            self.arm()

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
        self.conn: _Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports implement asyncio.Transport without subclassing it)
        transport = cast(asyncio.Transport, transport)
        self.inner.connection_made(transport)
        conn = self.conn = _Connection(transport, connections)
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


class RequestTracker:
    """ASGI middleware: tells the guard that a connection's request is in the app, and when it left;
    and answers 431 to a head larger than `max_header_bytes`. (h11 refuses such a head with 400 while it
    arrives in pieces; one that arrived whole in one read reaches the app.)"""

    def __init__(self, app: ASGIApp, *, max_header_bytes: int, guard: ConnectionGuard = connections) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if sum(len(name) + len(value) + 4 for name, value in scope["headers"]) > self.max_header_bytes:
            await _refuse_head(send, self.max_header_bytes)
            return
        client = scope.get("client")
        conn = self.guard.open.get((client[0], client[1])) if client else None
        if conn is None:
            await self.app(scope, receive, send)
            return
        conn.request_started()
        try:
            await self.app(scope, _body_within(receive, conn), send)
        finally:
            conn.request_done()


def _body_within(receive: Receive, conn: _Connection) -> Receive:
    """`receive`, with the request's body due within the guard's timeout of the request's start: a body
    that does not arrive in time aborts the connection (the app sees a disconnect). Once the body is
    complete, `receive` only waits for a disconnect, as long as the response takes."""
    deadline = conn.loop.time() + conn.guard.timeout_s
    complete = False

    async def receive_within() -> Message:
        nonlocal complete
        if complete:
            return await receive()
        try:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - conn.loop.time()))
        except TimeoutError:
            conn.drop()
            return {"type": "http.disconnect"}
        complete = message["type"] != "http.request" or not message.get("more_body", False)
        return message

    return receive_within


async def _refuse_head(send: Send, limit: int) -> None:
    detail = f"request headers larger than {limit} bytes ([api] max_header_bytes); send fewer or shorter headers"
    body = encode(problem_body(431, "headers_too_large", detail))
    await send(
        {
            "type": "http.response.start",
            "status": 431,
            "headers": [
                (b"content-type", MEDIA_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class GuardedH11(_Guarded):
    """h11 under the guard: the parser that bounds a connection. It stops reading while a response is
    pending (pipelined requests wait in the socket) and refuses a head that grows past
    `h11_max_incomplete_event_size` while it arrives (400)."""

    def _inner(self, *args: Any, **kwargs: Any) -> asyncio.Protocol:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol(*args, **kwargs)


class GuardedHttpTools(_Guarded):
    """httptools under the guard: less CPU per request, but it queues every pipelined request it has
    read and takes a head of any size; for a server behind a proxy that bounds both."""

    def _inner(self, *args: Any, **kwargs: Any) -> asyncio.Protocol:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol(*args, **kwargs)
