"""What the app holds for its routes (`app.state`), each piece behind a typed dependency.

`create_app` and its lifespan are the one place that puts these on `app.state`; a route declares
what it uses (`handler: Handler`) and FastAPI hands it over, typed for mypy. Each dependency only
reads an attribute: no I/O, and a coroutine, so FastAPI calls it on the event loop (it runs a plain
function in its thread pool: a thread hop per request).

FastAPI's solving of a dependency costs about 13 µs of CPU per request, so the hot routes (a command,
a view page) and `auth.require` await these functions themselves instead; the types are the same.

`AppState` is the rest of `app.state`: the caches `definitions` keeps of the user's files, read and
written by name there.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Any

from fastapi import Depends, Request
from psycopg_pool import AsyncConnectionPool
from starlette.datastructures import State

from tributary.api.http.metrics import Metrics
from tributary.api.http.status import Status
from tributary.api.http.subscriptions import Subscriptions
from tributary.api.http.views_db import Views
from tributary.api.settings.config import Settings
from tributary.consumers import GroupCoordinator, LogChanges
from tributary.eventstore.handler import CommandHandler

__all__ = [
    "AppState",
    "Coordinator",
    "Handler",
    "Changes",
    "MetricsOf",
    "Pool",
    "RefreshedStatus",
    "SettingsOf",
    "SubscriptionsOf",
    "ViewsOf",
    "app_state",
    "coordinator_of",
    "handler_of",
    "log_changes_of",
    "metrics_of",
    "pool_of",
    "settings_of",
    "status_of",
    "subscriptions_of",
    "views_of",
]


async def settings_of(request: Request) -> Settings:
    """The settings the app was created with (`[projections]` as edited since: `definitions`)."""
    settings: Settings = request.app.state.settings
    return settings


async def metrics_of(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


async def pool_of(request: Request) -> AsyncConnectionPool[Any]:
    """The service database's pool of autocommit connections (open from start-up)."""
    pool: AsyncConnectionPool[Any] = request.app.state.pool
    return pool


async def views_of(request: Request) -> Views | None:
    """The views' pool; None until start-up has opened it."""
    views: Views | None = getattr(request.app.state, "views", None)
    return views


async def handler_of(request: Request) -> CommandHandler:
    """The command handler (its aggregates follow the domain files: `definitions.current_aggregates`)."""
    handler: CommandHandler = request.app.state.handler
    return handler


async def subscriptions_of(request: Request) -> Subscriptions:
    subscriptions: Subscriptions = request.app.state.subscriptions
    return subscriptions


async def coordinator_of(request: Request) -> GroupCoordinator:
    coordinator: GroupCoordinator = request.app.state.coordinator
    return coordinator


async def log_changes_of(request: Request) -> LogChanges:
    """The log watcher that consumer-group pulls and streams sleep on."""
    changes: LogChanges = request.app.state.log_changes
    return changes


async def status_of(request: Request) -> Status | None:
    """The app's `Status` once it has been refreshed once (a call right after start-up waits for it);
    None before start-up."""
    status: Status | None = getattr(request.app.state, "status", None)
    if status is not None and not status.refreshed.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(status.refreshed.wait(), timeout=10)
    return status


async def app_state(request: Request) -> State:
    state: State = request.app.state
    return state


SettingsOf = Annotated[Settings, Depends(settings_of)]
MetricsOf = Annotated[Metrics, Depends(metrics_of)]
Pool = Annotated[AsyncConnectionPool[Any], Depends(pool_of)]
ViewsOf = Annotated[Views | None, Depends(views_of)]
Handler = Annotated[CommandHandler, Depends(handler_of)]
SubscriptionsOf = Annotated[Subscriptions, Depends(subscriptions_of)]
Coordinator = Annotated[GroupCoordinator, Depends(coordinator_of)]
Changes = Annotated[LogChanges, Depends(log_changes_of)]
RefreshedStatus = Annotated[Status | None, Depends(status_of)]
AppState = Annotated[State, Depends(app_state)]
