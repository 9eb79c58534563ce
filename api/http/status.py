"""What /readyz and /metrics answer from: `Status`, refreshed in the background by the app's lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from psycopg import errors
from psycopg_pool import AsyncConnectionPool
from starlette.datastructures import State

from tributary.api.http.definitions import current_aggregates, current_projections, current_settings
from tributary.api.http.metrics import Metrics
from tributary.api.settings.config import Settings
from tributary.capture.status import read_status
from tributary.consumers import GroupCoordinator

__all__ = ["Serving", "Status"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Serving:
    """What a refresh reads: the app's pool, settings, metrics and coordinator, and its state (where
    `definitions` keeps the user's files as they last loaded)."""

    state: State
    pool: AsyncConnectionPool[Any]
    settings: Settings
    metrics: Metrics
    dsn: str
    coordinator: GroupCoordinator | None


class Status:
    """What /readyz and /metrics report, refreshed in the background every `[api] status_refresh_s`.

    Both routes need no key, so a call answers from the last refresh: however often anonymous clients
    call, the database sees the pool's one query per refresh, the sources and the log one walk per
    refresh, and the log no line per call (a change of readiness is logged once)."""

    def __init__(self, interval_s: float, *, rebuilds: Callable[[], list[dict[str, Any]]]) -> None:
        self.interval_s = interval_s
        self.rebuilds = rebuilds  # the API's rebuilds, for their progress gauges
        self.body = orjson.dumps({"ready": False, "checks": {"status": "starting"}})
        self.ready = False
        self.refreshed = asyncio.Event()
        self.head: str | None = None  # the migrations' head revision, read once

    def start(self, on: Serving) -> asyncio.Task[None]:
        """Start refreshing in the background; the caller cancels the task on shutdown."""
        return asyncio.create_task(self.run(on), name="status-refresh")

    async def run(self, on: Serving) -> None:
        """Refresh until cancelled (the app's lifespan starts and stops it)."""
        failure = None
        while True:
            try:
                await self.refresh(on)
                failure = None
            except Exception as exc:  # noqa: BLE001 - the loop outlives a failed refresh; each new failure is logged
                if repr(exc) != failure:
                    log.exception("refreshing /readyz and /metrics failed; retrying every %s s", self.interval_s)
                failure = repr(exc)
            self.refreshed.set()
            await asyncio.sleep(self.interval_s)

    async def refresh(self, on: Serving) -> None:
        state = on.state
        checks = await self._database(on.pool)
        current = await asyncio.to_thread(read_status, on.settings.log.root) or {"sources": []}
        failed = [s["name"] for s in current.get("sources", []) if s.get("state") == "failed"]
        checks["capture"] = f"failed: {', '.join(failed)}" if failed else "ok"
        ready = all(v == "ok" for v in checks.values())
        if ready != self.ready:
            log.log(logging.INFO if ready else logging.WARNING, "readiness: %s", "ready" if ready else checks)
        self.ready, self.body = ready, orjson.dumps({"ready": ready, "checks": checks})
        settings = await asyncio.to_thread(current_settings, state)  # `[projections]` as the file says now
        projections = await asyncio.to_thread(current_projections, state)
        await asyncio.to_thread(current_aggregates, state)  # the metrics' and OpenAPI's stream types follow
        await asyncio.to_thread(
            on.metrics.refresh,
            settings,
            dsn=on.dsn,
            rebuilds=self.rebuilds(),
            groups=on.coordinator,
            projections=projections,
        )

    async def _database(self, pool: AsyncConnectionPool[Any]) -> dict[str, str]:
        """Service database reachable (one pooled connection) and migrations at head (its revision
        read from the table Alembic keeps, compared with the head read once from the scripts)."""
        checks: dict[str, str] = {}
        if self.head is None:
            try:
                from tributary.eventstore.migrate import head_revision

                self.head = await asyncio.to_thread(head_revision)
            except ImportError:
                pass
        try:
            async with pool.connection(timeout=3) as conn:
                try:
                    cur = await conn.execute("SELECT version_num FROM eventstore.alembic_version")
                    row = await cur.fetchone()
                    revision = row[0] if row else None
                except errors.UndefinedTable:
                    revision = None
            checks["database"] = "ok"
            if self.head is not None:
                checks["migrations"] = "ok" if revision == self.head else "pending"
        except Exception as exc:  # noqa: BLE001 - any failure is "not ready"; raising would leave the last answer standing
            checks["database"] = f"unreachable: {type(exc).__name__}"
        return checks
