"""uvicorn's httptools protocol, with a response's header and body leaving in one send.

uvicorn writes the status line and headers, then the body, as two `transport.write` calls: on a
TCP_NODELAY socket that is two segments, and a client that reads the headers first is woken twice
(measured on loopback: 1.73 reads per small response). Here the writes made in one event-loop step
are joined and sent at the end of it, so a small response is one segment and one wake-up.

A plain `GET /views/{name}` is answered from here, through `Service.view_response`, without uvicorn's
ASGI cycle (the app's wrapping middleware, two `send` messages, the header checks): its status line,
headers (uvicorn's defaults included) and body leave in one write. Anything `view_response` declines
runs the normal ASGI way. uvicorn's own bookkeeping (its task set, keep-alive, pipelining, flow
control, `Connection: close`) is kept: a request httptools read still has its `RequestResponseCycle`.

Such a request that arrives whole in one read, between requests, is read by `api.http_simple`
instead of httptools (whose callbacks, scope and cycle objects cost more than the rest of the HTTP
work); while it is answered, the connection's `cycle` is a small stand-in, so requests pipelined
behind it queue in uvicorn's pipeline as behind any request. After such a response the keep-alive
timer is not re-armed: one timer per connection is armed when none is, and on expiry it closes the
connection if it has been idle for `timeout_keep_alive` since the last response, else waits for the
rest (uvicorn arms and cancels a timer per request). Its coroutine runs under `_Run`, not an
asyncio task.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from tributary.api.http.http_simple import SimpleGet, simple_get

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

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _service(app: Any) -> Any:
    """The `api.app.Service` inside uvicorn's middleware wrappers, or `None`."""
    from tributary.api.http.app import Service

    for _ in range(16):
        if isinstance(app, Service):
            return app
        app = getattr(app, "app", None)
    return None


class _NoEvent:
    """`message_event` of a `_Pending`: its request has no body to wait for."""

    __slots__ = ()

    def set(self) -> None:
        pass


class _Pending:
    """The connection's `cycle` while a request read by `simple_get` is answered: what uvicorn reads
    of its current cycle (a request parsed meanwhile queues behind it; `connection_lost` and
    `shutdown` mark it)."""

    __slots__ = ("disconnected", "keep_alive", "response_complete")
    message_event = _NoEvent()

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.response_complete = False
        self.disconnected = False


class _Run:
    """A request's coroutine run as a task would run it, without an `asyncio.Task` (whose creation,
    registry, first scheduled step and done callback cost ≈ 5 µs, a tenth of a point lookup's Python):
    its first step runs at once, each later one when the future it awaits is done; it runs in its
    own copy of the context, as a task; it is in uvicorn's task set until it ends, and `cancel`
    (uvicorn's, after the graceful-shutdown timeout) cancels the future it awaits, as a task's.
    The coroutine must handle its own errors: one that escapes is logged."""

    __slots__ = ("_awaiting", "_context", "_coro", "_tasks")

    def __init__(self, coro: Coroutine[Any, Any, None], tasks: set[Any]) -> None:
        self._coro = coro
        self._context = contextvars.copy_context()
        self._tasks = tasks
        self._awaiting: asyncio.Future[Any] | None = None
        tasks.add(self)
        self._step()

    def _step(self, _: Any = None) -> None:
        self._awaiting = None
        try:
            awaited = self._context.run(self._coro.send, None)
        except StopIteration:
            self._tasks.discard(self)
            return
        except BaseException as exc:
            self._tasks.discard(self)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            if not isinstance(exc, asyncio.CancelledError):
                log.error("Exception in ASGI application", exc_info=exc)
            return
        if awaited is None:  # a bare `yield` (`asyncio.sleep(0)`): step again soon, as a task
            asyncio.get_running_loop().call_soon(self._step)
        elif getattr(awaited, "_asyncio_future_blocking", None):
            awaited._asyncio_future_blocking = False
            self._awaiting = awaited
            awaited.add_done_callback(self._step)
        else:  # as a task: only futures may be awaited
            self._coro.close()
            self._tasks.discard(self)
            log.error("Exception in ASGI application: awaited %r, not a future", awaited)

    def cancel(self, msg: Any = None) -> bool:
        if self._awaiting is None:
            return False
        return self._awaiting.cancel(msg)

    def done(self) -> bool:
        return self not in self._tasks


_VIEW_PREFIX = b"GET /views/"


class CoalescingHttpToolsProtocol(HttpToolsProtocol):
    """`uvicorn.run(..., http="tributary.api.http.http_protocol:CoalescingHttpToolsProtocol")`."""

    _service: Any = None
    _fast = False  # `simple_get` requests are served here (a `Service` app, no option that forbids it)
    _between = True  # httptools holds no part of a request (every byte fed to it ended a message)
    _idle_deadline: float | None = None  # when an idle connection closes; `None` while a request is read
    _idle_timer: asyncio.TimerHandle | None = None
    _defaults: list[tuple[bytes, bytes]] | None = None  # uvicorn's default headers, and as text:
    _defaults_text = b""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
        self._service = _service(self.app)
        self._fast = not (
            self._service is None
            or self.limit_concurrency is not None  # uvicorn's 503 when over the limit
            or self.config.reset_contextvars
            or self.access_log
            or self.root_path
        )

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def data_received(self, data: bytes) -> None:
        self._idle_deadline = None
        if self._fast and self._between and data.startswith(_VIEW_PREFIX):
            cycle = self.cycle
            if (cycle is None or cycle.response_complete) and (request := simple_get(data, _VIEW_PREFIX)):
                if self.timeout_keep_alive_task is not None:  # armed by a response of the app's
                    self._unset_keepalive_if_required()
                self._serve(request)
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        self._between = False
        super().on_message_begin()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._between = True

    def shutdown(self) -> None:
        if isinstance(self.cycle, _Pending) and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # as uvicorn's: answer, then close
            return
        super().shutdown()

    def _serve(self, request: SimpleGet) -> None:
        """Answer a request `simple_get` read (the scope is the one uvicorn would have built)."""
        path = request.path
        scope = {
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "root_path": "",
            "headers": request.headers,
            "state": self.app_state.copy(),
            "method": "GET",
            "path": path,
            "raw_path": path.encode("ascii"),
            "query_string": request.query,
        }
        pending = self.cycle = _Pending(request.keep_alive)  # type: ignore[assignment]
        _Run(self._answer(scope, pending), self.tasks)

    async def _answer(self, scope: Any, pending: _Pending) -> None:
        try:
            got = await self._service.view_response(scope)
        except Exception as exc:  # as uvicorn's `run_asgi` (`view_response` reports its own errors as 500s)
            log.error("Exception in ASGI application", exc_info=exc)
            cycle = self._cycle(scope, pending)
            await cycle.send_500_response()
            return
        if got is None:  # declined (an error to report, an unusual request): the app's way, in a
            # task of its own (Starlette and anyio look for the current task)
            await self.loop.create_task(self._cycle(scope, pending).run_asgi(self.app))
            return
        if self.flow.write_paused and not pending.disconnected:
            await self.flow.drain()  # the client reads slower than we answer: as uvicorn's `send`
        pending.response_complete = True
        if pending.disconnected:
            return
        self._write(got, pending.keep_alive)
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()  # as uvicorn's `on_response_complete`: requests that arrived meanwhile
        if self.pipeline:
            self._start_asgi_task(*self.pipeline.pop())
            return
        self._idle_deadline = deadline = self.loop.time() + self.timeout_keep_alive
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_at(deadline, self._idle_expired)

    def _idle_expired(self) -> None:
        self._idle_timer = None
        deadline = self._idle_deadline
        if deadline is None or self.transport.is_closing():
            return  # a request is being read or answered: its response arms the timer again
        if (wait := deadline - self.loop.time()) > 0:
            self._idle_timer = self.loop.call_later(wait, self._idle_expired)
        else:
            self.transport.close()

    def _cycle(self, scope: Any, pending: _Pending) -> RequestResponseCycle:
        """The `RequestResponseCycle` httptools would have made for the request `pending` stands for."""
        cycle = RequestResponseCycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=pending.keep_alive,
            on_response=self.on_response_complete,
        )
        cycle.more_body = False  # a GET without a body: the whole message is in
        cycle.message_event.set()
        cycle.disconnected = pending.disconnected
        if self.cycle is pending:  # type: ignore[comparison-overlap] # (`cycle` is typed as uvicorn's)
            self.cycle = cycle
        return cycle

    def _write(self, got: tuple[int, list[tuple[bytes, bytes]], bytes], keep_alive: bool) -> None:
        """A whole response (uvicorn's default headers first) in one write; closes unless `keep_alive`."""
        status, headers, body = got
        defaults = self.server_state.default_headers  # a new list each second (its date)
        if defaults is not self._defaults:
            self._defaults = defaults
            self._defaults_text = b"".join(b"%s: %s\r\n" % pair for pair in defaults)
        content = [STATUS_LINE[status], self._defaults_text]
        for name, value in headers:
            content.extend((name, b": ", value, b"\r\n"))
        if not keep_alive:
            content.append(b"connection: close\r\n")
        content.extend((b"\r\n", body))
        self.transport.write_now(b"".join(content))  # type: ignore[attr-defined]
        if not keep_alive:
            self.transport.close()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        scope = cycle.scope
        if not self._fast or scope["method"] != "GET" or not scope["path"].startswith("/views/"):
            super()._start_asgi_task(cycle, app)
            return
        task = self.loop.create_task(self._view(cycle, app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _view(self, cycle: RequestResponseCycle, app: Any) -> None:
        """`Service.view_response`'s answer to a request httptools read, written as uvicorn's `send`
        would write it, in one piece."""
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
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()  # the client reads slower than we answer: as uvicorn's `send`
        if cycle.disconnected:
            cycle.on_response = lambda: None
            return
        cycle.response_started = cycle.response_complete = True
        self._write(got, cycle.keep_alive)
        cycle.message_event.set()
        on_response, cycle.on_response = cycle.on_response, lambda: None
        on_response()
