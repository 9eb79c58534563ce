"""Consumer groups over HTTP (docs/consumers.md): one router of the members' routes (join, heartbeat,
leave: `routes_group_members`), the delivery routes (pull, commit, stream: `routes_group_delivery`) and
the admin routes (list, describe, reset: `routes_group_admin`), nack, park and the parked records
(`routes_group_parked`); the mapping of the consumers' errors to
HTTP; and the app's coordinator, log watcher and sweeper (`start_consumers`).

The group coordinator (`tributary.consumers.GroupCoordinator`) is synchronous psycopg; every call runs
in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from tributary.api.http import (
    routes_group_admin,
    routes_group_delivery,
    routes_group_members,
    routes_group_parked,
)
from tributary.api.http.groups_shared import consumer_problem
from tributary.api.http.problems import MEDIA_TYPE, encode
from tributary.api.http.routes_group_delivery import record_json
from tributary.api.settings.config import Settings
from tributary.api.settings.log import kafka_options
from tributary.consumers import (
    ConsumerError,
    GroupCoordinator,
    LogChanges,
)

__all__ = ["Consumers", "consumer_error", "record_json", "router", "start_consumers"]

log = logging.getLogger(__name__)
router = APIRouter()
router.include_router(routes_group_members.router)
router.include_router(routes_group_delivery.router)
router.include_router(routes_group_admin.router)
router.include_router(routes_group_parked.router)


async def consumer_error(request: Request, exc: Exception) -> Response:
    """A consumers' error as a problem (`groups_shared.consumer_status` maps it to a status)."""
    assert isinstance(exc, ConsumerError)
    body = consumer_problem(exc)
    return Response(encode(body), status_code=body["status"], media_type=MEDIA_TYPE)


async def _sweep(coordinator: GroupCoordinator, interval_s: float) -> None:
    failure = None
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(coordinator.sweep)
            failure = None
        except Exception as exc:  # noqa: BLE001 - the sweeper outlives a failure (e.g. before `tributary init`)
            if repr(exc) != failure:
                log.warning(
                    "moving the partitions of silent consumers failed: %s",
                    (str(exc) or type(exc).__name__).splitlines()[0],
                )
            failure = repr(exc)


def _end_streams_on_exit_signals(changes: LogChanges) -> None:
    """End every stream as soon as the server is told to stop (SIGTERM, SIGINT), then let the server's
    own handler run: uvicorn waits for open responses before it shuts the app down, and a stream never
    ends by itself. Chains the handler in place; outside the main thread there is none to chain."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if not callable(previous):
            continue

        def handler(signum: int, frame: FrameType | None, previous: Callable[..., Any] = previous) -> None:
            loop.call_soon_threadsafe(changes.end_waits)
            previous(signum, frame)

        try:
            signal.signal(sig, handler)
        except ValueError:  # not the main thread
            return


@dataclass(frozen=True)
class Consumers:
    """What the consumer-group routes run on: the coordinator, the log watcher, and the coroutine
    function that stops them and the sweeper (the lifespan awaits it on shutdown)."""

    coordinator: GroupCoordinator
    changes: LogChanges
    stop: Callable[[], Awaitable[None]]


def start_consumers(settings: Settings, *, dsn: str) -> Consumers:
    """Create the app's coordinator, log watcher and sweeper."""
    c = settings.consumers
    coordinator = GroupCoordinator(
        dsn,
        settings.log.root,
        session_timeout_ms=c.session_timeout_ms,
        auto_offset_reset=c.auto_offset_reset,
        poll_interval_ms=c.poll_interval_ms,
        kafka=kafka_options(settings),
        max_retries=c.max_retries,
        retry_backoff_ms=c.retry_backoff_ms,
        capture_sources=[s.name for s in settings.sources],
    )
    changes = LogChanges(coordinator.view, interval_s=coordinator.poll_interval_s)
    _end_streams_on_exit_signals(changes)
    sweeper = asyncio.create_task(_sweep(coordinator, c.sweep_interval_ms / 1000), name="consumer-sweeper")

    async def stop() -> None:
        sweeper.cancel()
        await changes.close()
        await asyncio.to_thread(coordinator.close)

    return Consumers(coordinator, changes, stop)
