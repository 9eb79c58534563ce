"""uvicorn's httptools protocol, with a response's header and body leaving in one send.

uvicorn writes the status line and headers, then the body, as two `transport.write` calls: on a
TCP_NODELAY socket that is two segments, and a client that reads the headers first is woken twice
(measured on loopback: 1.73 reads per small response). Here the writes made in one event-loop step
are joined and sent at the end of it, so a small response is one segment and one wake-up.

A plain `GET /views/{name}` is answered from here, through `Service.view_response`, without uvicorn's
ASGI cycle (the app's wrapping middleware, two `send` messages, the header checks): its status line,
headers (uvicorn's defaults included) and body leave in one write. Anything `view_response` declines
runs the normal ASGI way. uvicorn's own bookkeeping (its task set, keep-alive, pipelining, flow
control, `Connection: close`) is kept: the request still has its `RequestResponseCycle`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

log = logging.getLogger(__name__)

__all__ = ["CoalescingHttpToolsProtocol"]


class _CoalescingTransport:
    """A transport proxy: `write` collects; the collected bytes go out in one `write` once the
    running event-loop step ends (or before `close`). Everything else is the real transport's."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def write_now(self, data: bytes) -> None:
        """Send `data` (after anything collected) in this step: a response that is whole already."""
        if self._pending:
            self._pending.append(data)
            self._flush()
        elif not self._transport.is_closing():
            self._transport.write(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
            self._pending.clear()
            if not self._transport.is_closing():  # the peer went away meanwhile: nothing to send to
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _service(app: Any) -> Any:
    """The `api.app.Service` inside uvicorn's middleware wrappers, or `None`."""
    from api.app import Service

    for _ in range(16):
        if isinstance(app, Service):
            return app
        app = getattr(app, "app", None)
    return None


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """`uvicorn.run(..., http="api.http_protocol:CoalescingHttpToolsProtocol")`."""

    _service: Any = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        self._service = _service(self.app)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        scope = cycle.scope
        if (
            self._service is None
            or scope["method"] != "GET"
            or not scope["path"].startswith("/views/")
            or self.limit_concurrency is not None  # uvicorn's 503 when over the limit
            or self.config.reset_contextvars
            or self.access_log
        ):
            super()._start_asgi_task(cycle, app)
            return
        task = self.loop.create_task(self._view(cycle, app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _view(self, cycle: RequestResponseCycle, app: Any) -> None:
        """`Service.view_response`'s answer written as uvicorn's `send` would write it, in one piece."""
        try:
            got = await self._service.view_response(cycle.scope)
        except Exception as exc:  # as uvicorn's `run_asgi` (`view_response` reports its own errors as 500s)
            log.error("Exception in ASGI application", exc_info=exc)
            await cycle.send_500_response()
            cycle.on_response = lambda: None
            return
        if got is None:
            await cycle.run_asgi(app)  # declined (an error to report, an unusual request): the app's way
            return
        status, headers, body = got
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()  # the client reads slower than we answer: as uvicorn's `send`
        if cycle.disconnected:
            cycle.on_response = lambda: None
            return
        content = [STATUS_LINE[status]]
        for name, value in (*cycle.default_headers, *headers):
            content.extend((name, b": ", value, b"\r\n"))
        if not cycle.keep_alive:
            content.append(b"connection: close\r\n")
        content.extend((b"\r\n", body))
        cycle.response_started = cycle.response_complete = True
        self.transport.write_now(b"".join(content))  # type: ignore[attr-defined]
        cycle.message_event.set()
        if not cycle.keep_alive:
            self.transport.close()
        on_response, cycle.on_response = cycle.on_response, lambda: None
        on_response()
