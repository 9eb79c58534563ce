"""Routes answered ahead of FastAPI's middleware stack (`Ahead`), with the answers they get through it.

What a view page pays between `front.Front` and its endpoint without doing anything its answer
needs: FastAPI's entry (its telemetry check reads three environment variables per request), the
error and exception middleware, the exit-stack middleware, the route table's match and Starlette's
request wrapper, about a fifth of the page's Python calls. A route answered here skips them; its
errors go to the same handlers, looked up as Starlette looks them up
(https://www.starlette.io/exceptions/):

- an `HTTPException` to a handler registered for its status code, else
- any exception to the handler of the first class of its MRO registered, except `Exception`'s
  (and `500`'s), which is Starlette's `ServerErrorMiddleware`'s: that one answers (when no
  response has started) and the exception is raised again, to the server.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Message, Receive, Scope, Send

__all__ = ["Ahead"]


class Ahead:
    """Plain routes, each with an endpoint `(Request) -> Response`, answered before the app's
    middleware stack; only requests whose path starts with `prefix` are tried (one string test for
    every other request)."""

    def __init__(self, routes: Sequence[Route], *, prefix: str = "/") -> None:
        self.routes = tuple(routes)
        self.prefix = prefix

    def match(self, scope: Scope) -> Route | None:
        """The route that takes this request wholly (path and method), its parameters put in `scope`
        as Starlette's router puts them; None for the app's own handling."""
        if scope["type"] != "http" or scope.get("root_path") or not scope["path"].startswith(self.prefix):
            return None
        for route in self.routes:
            match, child_scope = route.matches(scope)
            if match is Match.FULL:
                scope.update(child_scope)
                return route
        return None

    async def serve(self, app: Starlette, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        """`route`'s answer, or its error's (see the module's docstring)."""
        scope["app"] = app
        request = Request(scope, receive, send)
        started = False

        async def send_on(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            response: Response = await route.endpoint(request)
            await response(scope, receive, send_on)
        except Exception as exc:
            handler, last = _handler(app, exc)
            if handler is None or (started and not last):
                raise
            if inspect.iscoroutinefunction(handler):
                answer = await cast(Awaitable[Response], handler(request, exc))
            else:  # a plain function: in the thread pool, as Starlette runs it
                answer = cast(Response, await run_in_threadpool(handler, request, exc))
            if not started:
                await answer(scope, receive, send_on)
            if last:
                raise
            exc.__traceback__ = None


# An HTTP exception handler (Starlette's `ExceptionHandler` is its union with a WebSocket's).
_Handler = Callable[[Request, Exception], Awaitable[Response] | Response]


def _handler(app: Starlette, exc: Exception) -> tuple[_Handler | None, bool]:
    """The app's handler of `exc`, and whether it is the last resort (`Exception`'s or `500`'s)."""
    handlers = cast(dict[Any, _Handler], app.exception_handlers)
    if isinstance(exc, HTTPException) and exc.status_code in handlers and exc.status_code != 500:
        return handlers[exc.status_code], False
    for cls in type(exc).__mro__:
        if cls is Exception:
            break
        if cls in handlers:
            return handlers[cls], False
    last = handlers.get(500) or handlers.get(Exception)
    return last, True
