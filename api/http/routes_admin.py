"""Health, readiness, metrics, and the admin views of sources, topics and projections."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Depends, Path
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel

from tributary.api.http.answers import event_store_problem
from tributary.api.http.auth import AUTH_RESPONSES, error, require
from tributary.api.http.definitions import (
    current_projections,
    current_run_settings,
    definition_problems,
    due,
    projection_problem,
    refresh_definitions,
)
from tributary.api.http.problems import Problem
from tributary.api.http.state import AppState, Handler, MetricsOf, RefreshedStatus, SettingsOf, status_of
from tributary.api.settings.config import Settings
from tributary.api.settings.log import log_admin
from tributary.api.settings.sources import source_statuses
from tributary.eventstore.errors import EventStoreError
from tributary.eventstore.values import MAX_ID_LENGTH
from tributary.log import VIEW_TIMEOUT_S, LogError, TopicSummary

if TYPE_CHECKING:  # imported where used: the API starts without the projections' Spark glue
    from tributary.projections.runner import RunSettings

__all__ = ["rebuilds", "router"]

router = APIRouter()
_JSON = "application/json"


class Readiness(BaseModel):
    ready: bool
    checks: dict[str, str] = {}


class Rebuild(BaseModel):
    """A rebuild started from the API; `build`, `table`, `records` once done, `finished_at` once over;
    `stage` ends as `done` or `failed` (with `error`)."""

    id: str
    projection: str
    state: str
    stage: str
    done: int
    total: int
    started_at: float
    error: str | None
    build: int | None = None
    table: str | None = None
    records: int | None = None
    finished_at: float | None = None


@router.get("/healthz", tags=["ops"])
async def healthz(state: AppState) -> dict[str, Any]:
    """The process is up; `problems` (only when there are any): parts running in this process that
    failed, by name (`tributary demo` runs capture, projections and workloads beside the API), and
    user files that do not load now (`config`, `[projections] modules`, `[eventstore] modules`:
    the API serves their last good definitions)."""
    if due(state, "definitions"):  # monitors call this often: the files are looked at once a second at most
        await asyncio.to_thread(refresh_definitions, state)
    problems = dict(getattr(state, "problems", None) or {}) | definition_problems(state)
    return {"status": "ok", "problems": problems} if problems else {"status": "ok"}


@router.get(
    "/readyz",
    tags=["ops"],
    responses={200: {"model": Readiness}, 503: {"model": Readiness, "description": "not ready: see `checks`"}},
)
async def readyz(status: RefreshedStatus) -> Response:
    """Service database reachable, migrations current, capture not failed (as of the last background
    refresh, at most `[api] status_refresh_s` old)."""
    if status is None:
        return Response(orjson.dumps({"ready": False, "checks": {"status": "starting"}}), 503, media_type=_JSON)
    return Response(status.body, status_code=200 if status.ready else 503, media_type=_JSON)


@router.get("/metrics", tags=["ops"], response_class=PlainTextResponse, dependencies=[Depends(status_of)])
async def metrics(m: MetricsOf) -> Response:
    """Prometheus text format: request and command counts as of now, gauges as of the last background
    refresh (at most `[api] status_refresh_s` old)."""
    return Response(m.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/sources", tags=["admin"], dependencies=[Depends(require("admin"))], responses=AUTH_RESPONSES)
async def sources(settings: SettingsOf) -> list[dict[str, Any]]:
    """Each source: state, last LSN, slot lag bytes, changes/s, snapshot progress, warnings."""
    _, rows = await asyncio.to_thread(source_statuses, settings)
    return rows


def _topics(settings: Settings) -> list[TopicSummary]:
    admin = log_admin(settings, timeout_s=VIEW_TIMEOUT_S)
    try:
        if not admin.exists():
            return []  # nothing captured yet
        return admin.topics()
    except LogError as exc:  # e.g. segments without a manifest (not an empty log), Kafka unreachable
        raise Problem(503, "log_unreadable", str(exc)) from None


@router.get(
    "/topics",
    tags=["admin"],
    dependencies=[Depends(require("admin"))],
    responses={
        **AUTH_RESPONSES,
        503: error("the log cannot be read as it is (the message says how to repair it), or Kafka cannot be reached"),
    },
    response_model=list[dict[str, Any]],  # the document's schema: free-form objects, as before the rows were typed
)
async def topics(settings: SettingsOf) -> list[TopicSummary]:
    """Every topic: partitions, policy, `records` (`data_records` + `schema_records`), committed
    offsets; for `compact` topics, `compaction`: when the capture daemon's background cleaner last
    compacted it and records/bytes before → after (`cleaner.json`). On the Kafka backend: the
    cluster's topics, `policy` "broker", `records` = offsets from start to end (markers included)."""
    return await asyncio.to_thread(_topics, settings)


# -- projections -------------------------------------------------------------------------------

_rebuilds: dict[str, dict[str, Any]] = {}
_rebuild_lock = threading.Lock()


def rebuilds() -> list[dict[str, Any]]:
    """The rebuilds started from the API in this process, running or over (for /metrics)."""
    return list(_rebuilds.values())


@router.get("/projections", tags=["admin"], dependencies=[Depends(require("admin"))], responses=AUTH_RESPONSES)
async def projections(state: AppState) -> list[dict[str, Any]]:
    """Version, serving build, state (`done` only when caught up: `behind` while `lag` > 0, see
    `label`), lag, and any rebuild started from the API with its progress; `problem`: the one-line
    error of its file when that file does not load now (its last good definition is served). A file
    that never loaded is a row of its own: `name` null, `module`, `state` "not loadable", `problem`."""
    from tributary.projections.runner import ProjectionStatus, status

    running = {b["projection"]: b for b in list(_rebuilds.values()) if b["state"] == "running"}

    def read() -> list[Any]:
        served = current_projections(state, fresh=True)
        return status(current_run_settings(state), projections=served, rebuilding=set(running))

    rows = await asyncio.to_thread(read)
    out = []
    for r in rows:
        entry = {k: getattr(r, k) for k in r.__slots__}
        entry["module"] = state.projection_origin.get(r.name)
        entry["problem"] = projection_problem(state, r.name)
        entry["rebuild"] = running.get(r.name)
        out.append(entry)
    for ref, problem in sorted(state.projection_problems.items()):
        if ref not in state.projection_origin.values():  # nothing of it is served
            empty = dict.fromkeys(ProjectionStatus.__slots__)
            out.append(empty | {"state": "not loadable", "module": ref, "problem": problem, "rebuild": None})
    return out


@router.post(
    "/projections/{name}/rebuild",
    status_code=202,
    response_model=Rebuild,
    response_model_exclude_unset=True,
    tags=["admin"],
    dependencies=[Depends(require("admin"))],
    responses={
        **AUTH_RESPONSES,
        404: error("no projection with this name"),
        409: error("`projection_not_loadable`: the projection's file does not load now"),
    },
)
async def start_rebuild(name: str, state: AppState) -> dict[str, Any]:
    """Start a rebuild in the background (in its own process, reading the projection files as they
    are now); 202 with an id to poll at GET /rebuilds/{id}."""
    settings = await asyncio.to_thread(current_run_settings, state)
    if name not in await asyncio.to_thread(lambda: current_projections(state, fresh=True)):
        raise Problem(404, "unknown_projection", f"no projection named {name!r}")
    problem = projection_problem(state, name)
    if problem is not None:  # a rebuild runs the file as it is on disk: it would fail
        raise Problem(409, "projection_not_loadable", f"{problem}; fix the file, then rebuild")
    return _start_rebuild(name, settings)


def _start_rebuild(name: str, settings: RunSettings) -> dict[str, Any]:
    """The running rebuild of `name`, or a new one started in a background thread."""
    with _rebuild_lock:
        running = [b for b in _rebuilds.values() if b["projection"] == name and b["state"] == "running"]
        if running:
            return running[0]
        rebuild_id = uuid.uuid4().hex[:12]
        entry: dict[str, Any] = {
            "id": rebuild_id,
            "projection": name,
            "state": "running",
            "stage": "starting",
            "done": 0,
            "total": 0,
            "started_at": time.time(),
            "error": None,
        }
        _rebuilds[rebuild_id] = entry
    threading.Thread(target=_rebuild_worker, args=(entry, settings), daemon=True, name=f"rebuild-{name}").start()
    return entry


def _rebuild_worker(entry: dict[str, Any], settings: RunSettings) -> None:
    from tributary.projections.runner import rebuild_process

    def progress(stage: str, done: int, total: int) -> None:
        entry.update(stage=stage, done=done, total=total)

    try:
        result = rebuild_process(entry["projection"], settings, progress=progress)
        entry.update(state="done", stage="done", build=result.build, table=result.table, records=result.records)
    except Exception as exc:  # noqa: BLE001 - reported through the API, not raised into a thread
        error_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        entry.update(state="failed", stage="failed", error=error_line)
    entry["finished_at"] = time.time()


@router.delete(
    "/subjects/{subject_id}",
    status_code=204,
    tags=["admin"],
    dependencies=[Depends(require("admin"))],
    responses={
        **AUTH_RESPONSES,
        422: error("`invalid_value`: a subject id the database cannot store (a NUL, an unpaired surrogate)"),
        503: error("the service database did not answer; retry (a forget can be repeated)"),
    },
)
async def forget_subject(
    state: AppState, handler: Handler, subject_id: str = Path(min_length=1, max_length=MAX_ID_LENGTH)
) -> Response:
    """Forget a data subject: destroy its keys (its personal data reads as erased everywhere from
    now on), delete its streams' snapshots, and start a rebuild of every projection that reads
    them (see GET /projections). Idempotent."""
    from tributary.eventstore.forget import forget, projections_reading

    try:
        done = await asyncio.to_thread(forget, handler.store, subject_id)
    except EventStoreError as exc:  # the event store's one mapping: 422 invalid_value, 503 unavailable
        raise event_store_problem(exc) from None
    if done.streams:
        settings = await asyncio.to_thread(current_run_settings, state)
        defined = await asyncio.to_thread(lambda: current_projections(state, fresh=True))
        for name in projections_reading(((p.name, p.topics) for p in defined.values()), done.stream_types):
            if projection_problem(state, name) is None:
                _start_rebuild(name, settings)
    return Response(status_code=204)


@router.get(
    "/rebuilds/{rebuild_id}",
    response_model=Rebuild,
    response_model_exclude_unset=True,
    tags=["admin"],
    dependencies=[Depends(require("admin"))],
    responses={**AUTH_RESPONSES, 404: error("no rebuild with this id")},
)
async def rebuild_progress(rebuild_id: str) -> dict[str, Any]:
    """Progress of a rebuild started with POST /projections/{name}/rebuild."""
    entry = _rebuilds.get(rebuild_id)
    if entry is None:
        raise Problem(404, "unknown_rebuild", f"no rebuild {rebuild_id!r}")
    return entry


_CONSOLE = None


@router.get("/", include_in_schema=False)
async def console() -> Response:
    """The console page: sources, topics, projections (with rebuild), a view browser."""
    global _CONSOLE
    if _CONSOLE is None:
        from importlib.resources import files

        _CONSOLE = (files("tributary.api.http") / "static" / "console.html").read_bytes()
    return Response(_CONSOLE, media_type="text/html; charset=utf-8")
