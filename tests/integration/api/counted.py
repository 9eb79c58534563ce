"""An ASGI app wrapped to count its Python calls on the event loop's thread: what the route tests
compare between a hot route and FastAPI's (the handler's worker threads and the client are not
profiled)."""

from __future__ import annotations

import cProfile

from starlette.types import ASGIApp, Receive, Scope, Send


class Counted:
    """The app, its Python calls counted in `profile` while `counting` is set."""

    def __init__(self, app: ASGIApp) -> None:
        self.app, self.profile = app, cProfile.Profile()
        self.counting = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.counting:
            self.profile.enable()
        try:
            await self.app(scope, receive, send)
        finally:
            self.profile.disable()
