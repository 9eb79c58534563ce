"""What every HTTP request goes through before FastAPI, in one pure-ASGI layer (`Front`): its id, its
count in the metrics, the limits on its head and body, its connection's deadline, and HEAD run as GET.

One layer on purpose: each ASGI middleware wraps `send` and `receive` once more per request, and a
Starlette `BaseHTTPMiddleware` costs a task and a stream besides.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import secrets

from starlette.exceptions import HTTPException
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tributary.api.http.head import HEAD_MARK
from tributary.api.http.limits import Connection, ConnectionGuard, connections, head_too_large, refusal
from tributary.api.http.metrics import Metrics
from tributary.api.settings.logs import REQUEST_ID

__all__ = ["Front", "TemplateRoute"]

_CLIENT_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:-]{1,64}")


def _new_id_prefix() -> None:
    global _id_prefix, _id_seq
    _id_prefix, _id_seq = secrets.token_hex(5) + "-", itertools.count(1)


_id_prefix, _id_seq = "", itertools.count(1)
_new_id_prefix()
os.register_at_fork(after_in_child=_new_id_prefix)  # forked workers must not repeat the parent's ids


def _request_id(scope: Scope) -> bytes:
    """The client's `X-Request-ID` when it is a short token, else a new one."""
    request_id = b""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            request_id = value
    if not (request_id and _CLIENT_REQUEST_ID.fullmatch(request_id)):
        request_id = f"{_id_prefix}{next(_id_seq):x}".encode()
    return request_id


class TemplateRoute(Route):
    """A plain Starlette route that names itself in the request's scope as FastAPI's routes do
    (FastAPI's router does not), so that `Front` counts its requests by its path template."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self
        return match, child_scope


class Front:
    """Pure ASGI, around the whole FastAPI app (outside its error handling, so a 500 from its error
    handler is counted and carries the id too):

    - a request id (the client's `X-Request-ID` when it is a short token, else a new
      `<process prefix>-<counter>`), sent back as `X-Request-ID` and in every log record written while
      serving the request (`api.logs.REQUEST_ID`);
    - a count in `tributary_http_requests_total` by method, route template and status;
    - 431 to a head larger than `max_header_bytes` (a parser may pass one that arrived whole in one
      read), 413 to a body larger than `max_body_bytes` (by Content-Length at once, else while it
      streams: FastAPI's handler of `HTTPException` answers it);
    - the connection guard told that the connection's request is in the app and when it left, and
      the request's body due within the guard's timeout (else the connection is dropped);
    - HEAD run as GET, only the response's start sent (RFC 9110 §9.3.2: FastAPI routes declare GET)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        metrics: Metrics,
        max_body_bytes: int,
        max_header_bytes: int,
        guard: ConnectionGuard = connections,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _request_id(scope)
        token = REQUEST_ID.set(request_id.decode())
        id_header = (b"x-request-id", request_id)
        status = 500  # until the app's response starts
        started = False
        head = scope["method"] == "HEAD"

        async def send_on(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                message["headers"] = [*message.get("headers", ()), id_header]
            elif head and message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        # HEAD: a copy, since the server keeps its own scope (and its HEAD) to frame the response;
        # `HEAD_MARK` tells a route that never ends by itself (a subscription) to answer at once.
        inner = {**scope, "method": "GET", HEAD_MARK: True} if head else scope
        client = scope.get("client")
        conn = self.guard.open.get((client[0], client[1])) if client else None
        if conn is not None:  # (a refused request too: the guard counts every head its parser passed on)
            conn.request_started()
        try:
            refused = self._refused(scope)
            if refused is not None:
                for message in refused:
                    await send_on(message)
                return
            await self.app(inner, self._receive(receive, conn), send_on)
        except Exception:
            # Starlette re-raises an error after its handler (`unexpected`) has logged it and sent the
            # 500; the server would log it a second time and drop the keep-alive connection. An error
            # after another response had started (a body cut short) is the server's to log and close.
            if not (started and status == 500):
                raise
        finally:
            if conn is not None:
                conn.request_done()
            route = getattr(inner.get("route"), "path", None) or "unmatched"
            self.metrics.count_request(scope["method"], route, status)
            REQUEST_ID.reset(token)

    def _refused(self, scope: Scope) -> tuple[Message, Message] | None:
        """The 431 or 413 a request gets before the app, from its head alone; None when it may go on."""
        size = 0
        length = None
        for name, value in scope["headers"]:
            size += len(name) + len(value) + 4
            if name == b"content-length":
                length = value
        if size > self.max_header_bytes:
            return refusal(431, head_too_large(self.max_header_bytes), close=True)
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return refusal(413, self._too_large())
        return None

    def _too_large(self) -> str:
        return f"request body larger than {self.max_body_bytes} bytes ([api] max_body_bytes)"

    def _receive(self, receive: Receive, conn: Connection | None) -> Receive:
        """`receive`, refusing a body past `max_body_bytes` while it streams (413), and with the body
        due within the guard's timeout of the request's start: a body that does not arrive in time
        drops the connection (the app sees a disconnect). Once the body is complete, `receive` only
        waits for a disconnect, as long as the response takes."""
        deadline = conn.loop.time() + conn.guard.timeout_s if conn is not None else 0.0
        complete = conn is None
        seen = 0

        async def receive_within() -> Message:
            nonlocal complete, seen
            if complete:
                message = await receive()
            else:
                assert conn is not None
                conn.body_wanted(True)
                try:
                    message = await asyncio.wait_for(receive(), max(0.0, deadline - conn.loop.time()))
                except TimeoutError:
                    conn.drop()
                    return {"type": "http.disconnect"}
                finally:
                    conn.body_wanted(False)
                complete = message["type"] != "http.request" or not message.get("more_body", False)
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:
                    raise HTTPException(413, self._too_large())
            return message

        return receive_within
