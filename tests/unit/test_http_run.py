"""`api.http_protocol._Run` runs a request's coroutine as an asyncio task would: first step at once,
then on each awaited future; in its own context; in the task set until it ends; cancellable."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
import uvloop

from tributary.api.http.http_protocol import _Run

pytestmark = pytest.mark.unit

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="outer")


def test_steps_results_errors_and_context() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        tasks: set[Any] = set()
        seen: list[Any] = []
        fut: asyncio.Future[int] = loop.create_future()
        failing: asyncio.Future[int] = loop.create_future()

        async def request() -> None:
            VAR.set("inner")
            seen.append("started")
            seen.append(await fut)
            await asyncio.sleep(0)  # a bare yield
            await asyncio.sleep(0.01)  # a timer's future
            try:
                await failing
            except ValueError as exc:
                seen.append(str(exc))
            seen.append(VAR.get())

        run = _Run(request(), tasks)
        assert seen == ["started"] and run in tasks and not run.done()  # the first step ran at once
        assert VAR.get() == "outer"  # its context is its own
        fut.set_result(7)
        failing.set_exception(ValueError("bad"))
        for _ in range(100):
            if run.done():
                break
            await asyncio.sleep(0.005)
        assert seen == ["started", 7, "bad", "inner"] and not tasks

    uvloop.run(main())


def test_cancel_and_an_escaping_error(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        tasks: set[Any] = set()
        waited: asyncio.Future[None] = loop.create_future()
        cancelled: list[bool] = []

        async def waits() -> None:
            try:
                await waited
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        run = _Run(waits(), tasks)
        assert run.cancel("shutting down")  # as uvicorn cancels its tasks after the grace period
        await asyncio.sleep(0.01)
        assert cancelled == [True] and run.done() and not tasks

        async def fails() -> None:
            await asyncio.sleep(0)
            raise RuntimeError("boom")

        _Run(fails(), tasks)
        await asyncio.sleep(0.01)
        assert not tasks

    uvloop.run(main())
    assert any("boom" in (r.exc_text or "") or "boom" in str(r.exc_info) for r in caplog.records)
