"""HEAD answers as GET would, without the body (RFC 9110 §9.3.2): FastAPI routes declare GET only,
so HEAD /healthz was a 405 for monitors and load balancers that probe with it."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HEAD_MARK", "HeadAsGet"]

HEAD_MARK = "tributary.head"  # in the scope of a HEAD request run as a GET


class HeadAsGet:
    """ASGI middleware: run a HEAD request as a GET and send only the response's start (status and
    headers, with GET's content-length)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return

        async def without_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        # A copy: the server keeps its own scope (and its HEAD) to frame the response. The route the
        # router matched goes back to the caller's scope (the request counts label it).
        # `HEAD_MARK` tells a route that never ends by itself (a subscription) to answer at once.
        as_get = {**scope, "method": "GET", HEAD_MARK: True}
        try:
            await self.app(as_get, receive, without_body)
        finally:
            if "route" in as_get:
                scope["route"] = as_get["route"]
