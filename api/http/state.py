"""What the app holds for its routes (`app.state`), each piece behind a typed dependency.

`create_app` and its lifespan are the one place that puts these on `app.state`; a route declares
what it uses (`handler: Handler`) and FastAPI hands it over, typed for mypy. Each dependency only
reads an attribute: no I/O, and a coroutine, so FastAPI calls it on the event loop (it runs a plain
function in its thread pool: a thread hop per request). The functions also serve code that has a
request but is not a route's signature (`auth.require`).

`AppState` is the rest of `app.state`: the caches `definitions` keeps of the user's files, read and
written by name there. The background refresh behind /readyz and /metrics has its dependency beside
its class (`routes_admin.RefreshedStatus`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from psycopg_pool import AsyncConnectionPool
from starlette.datastructures import State

from tributary.api.http.metrics import Metrics
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


async def handler_of(request: Request) -> CommandHandler | None:
    """The command handler (its aggregates follow the domain files: `definitions.current_aggregates`);
    None until start-up has opened the event store. The route says so itself: FastAPI solves
    dependencies before it validates the body, so one that raised would hide a refused body's 422."""
    handler: CommandHandler | None = getattr(request.app.state, "handler", None)
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


async def app_state(request: Request) -> State:
    state: State = request.app.state
    return state


SettingsOf = Annotated[Settings, Depends(settings_of)]
MetricsOf = Annotated[Metrics, Depends(metrics_of)]
Pool = Annotated[AsyncConnectionPool[Any], Depends(pool_of)]
ViewsOf = Annotated[Views | None, Depends(views_of)]
Handler = Annotated[CommandHandler | None, Depends(handler_of)]
SubscriptionsOf = Annotated[Subscriptions, Depends(subscriptions_of)]
Coordinator = Annotated[GroupCoordinator, Depends(coordinator_of)]
Changes = Annotated[LogChanges, Depends(log_changes_of)]
AppState = Annotated[State, Depends(app_state)]
