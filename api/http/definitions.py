"""The projections and aggregates a running API serves, as the config file and the user's files say *now*.

`tributary serve` runs for weeks while users add `[projections] modules` and `[eventstore] modules`
and edit those files: `/projections`, `/views`, rebuilds and commands must see the changes without
a restart. Reading is cheap: one `stat` of the config file and of each module's file (at most once
a second); a file is read again only when its stamp (mtime, size) changed.

A file saved half-way (a syntax error, a definition that breaks a rule) never takes the served
definitions down: the API keeps serving what that file defined when it last loaded, and says which
file does not load and why in one line (`definition_problems`: `/healthz`, `/projections`, the
console).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.datastructures import State

from tributary.api.settings.config import DEFAULT_CONFIG, ConfigError, ProjectionSettings, Settings, load_settings

if TYPE_CHECKING:  # imported when first used: the API starts without Spark's modules
    from tributary.eventstore.aggregate import Aggregate
    from tributary.projections.definition import Projection
    from tributary.projections.runner import RunSettings

__all__ = [
    "config_file",
    "current_aggregates",
    "current_projection_settings",
    "current_projections",
    "current_run_settings",
    "current_settings",
    "definition_problems",
    "due",
    "projection_problem",
    "refresh_definitions",
]

log = logging.getLogger(__name__)
RECHECK_S = 1.0  # how stale the definitions the API serves may be
_lock = threading.Lock()
_defs_lock = threading.RLock()
T = TypeVar("T")


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def config_file(config: Path | None) -> Path | None:
    """The file `load_settings(config)` reads (absolute, so a later chdir does not matter), if any:
    set it as `app.state.config_path` and the app follows its `[projections]` and `[eventstore]`."""
    path = config if config is not None else DEFAULT_CONFIG
    return path.resolve() if path.exists() else None


def _file_settings(state: State) -> Settings:
    """The settings of the config file the app was started with (`state.config_path`), read again
    when the file changed; the last that loaded when it no longer loads (said once per change)."""
    path: Path | None = getattr(state, "config_path", None)
    started: Settings = state.settings
    if path is None:
        return started
    stamp = _stamp(path)
    with _lock:
        if getattr(state, "config_stamp", None) == stamp:
            unchanged: Settings = state.file_settings
            return unchanged
        settings: Settings = getattr(state, "file_settings", started)
        if stamp is not None:
            try:
                settings = load_settings(path)
                state.config_problem = None
            except ConfigError as exc:  # keep serving what loaded last; say why once per change
                first = str(exc).splitlines()[0]
                state.config_problem = f"{path} does not load ({first}); serving its last good settings"
                log.warning("config file %s changed but does not load (%s); keeping its last settings", path, exc)
        state.config_stamp, state.file_settings = stamp, settings
        return settings


def current_projection_settings(state: State) -> ProjectionSettings:
    """`[projections]` as the config file says now."""
    return _file_settings(state).projections


def due(state: State, what: str) -> bool:
    """Whether `what` was last looked at more than `RECHECK_S` ago (and mark it looked at now)."""
    now = time.monotonic()
    if now - getattr(state, f"{what}_checked_at", -RECHECK_S) < RECHECK_S:
        return False
    setattr(state, f"{what}_checked_at", now)
    return True


def _line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def _load_each(
    refs: tuple[str, ...],
    load_one: Callable[[str], Mapping[str, T]],
    last_good: Mapping[str, Mapping[str, T]],
    what: str,
) -> tuple[dict[str, Mapping[str, T]], dict[str, str], dict[str, str]]:
    """Each module's definitions as it loads now, or as it last loaded when it does not load now
    (its problem in one line); then all of them by name, with the module each came from."""
    good: dict[str, Mapping[str, T]] = {}
    problems: dict[str, str] = {}
    for ref in refs:
        try:
            good[ref] = load_one(ref)
        except Exception as exc:  # noqa: BLE001 - a user's file saved half-way: reported, the last good one served
            problems[ref] = _line(exc)
            if ref in last_good:
                good[ref] = last_good[ref]
    origin: dict[str, str] = {}
    for ref, defs in good.items():
        for name in defs:
            if name in origin:
                problems.setdefault(ref, f"{ref}: {what} {name!r} is already defined by {origin[name]}")
            else:
                origin[name] = ref
    return good, problems, origin


def current_projections(state: State, *, fresh: bool = False) -> dict[str, Projection]:
    """Every configured projection by name, from the files as they were at most `RECHECK_S` ago
    (the views route calls this per request: the `stat`s are paid once per interval, not per page),
    or as they are now (`fresh`: `/projections` and rebuilds). A file that does not load keeps its
    last good projections (`state.projection_problems`)."""
    from tributary.projections.loader import load_current

    with _defs_lock:
        last: dict[str, Projection] | None = getattr(state, "last_projections", None)
        if last is not None and not due(state, "projections") and not fresh:
            return last
        pr = current_projection_settings(state)
        refs = tuple(pr.modules) + (("[projections] mirror",) if pr.mirror else ())

        def load_one(ref: str) -> Mapping[str, Projection]:
            return load_current((), tuple(pr.mirror)) if ref == "[projections] mirror" else load_current((ref,))

        before = getattr(state, "projection_problems", {})
        good, problems, origin = _load_each(refs, load_one, getattr(state, "projections_by_module", {}), "projection")
        for ref, problem in problems.items():
            if before.get(ref) != problem:
                log.warning("projection file %s does not load; serving its last good definitions", problem)
        state.projections_by_module, state.projection_problems, state.projection_origin = good, problems, origin
        found = {name: good[ref][name] for name, ref in origin.items()}
        state.last_projections = found
        return found


def projection_problem(state: State, name: str) -> str | None:
    """The one-line problem of the file projection `name` comes from, if that file does not load now."""
    ref = getattr(state, "projection_origin", {}).get(name)
    return getattr(state, "projection_problems", {}).get(ref) if ref else None


def current_aggregates(state: State, *, checked: bool = False) -> dict[str, Aggregate[Any]]:
    """Every aggregate of `[eventstore] modules` by stream type, as the config and the domain files
    say at most `RECHECK_S` ago; a file that does not load keeps its last good aggregates
    (`state.aggregate_problems`). The command handler, the metrics and `/openapi.json` follow.
    `checked`: the caller has just found it `due`."""
    from tributary.eventstore.loader import load_current

    with _defs_lock:
        last: dict[str, Aggregate[Any]] = getattr(state, "aggregates", {})
        if not checked and not due(state, "aggregates"):
            return last
        modules = tuple(_file_settings(state).eventstore.modules)
        if not hasattr(state, "aggregates_by_module"):  # what create_app loaded, all of it, from these files
            state.aggregates_by_module = {}
        before = getattr(state, "aggregate_problems", {})
        good, problems, origin = _load_each(
            modules, lambda ref: load_current((ref,)), state.aggregates_by_module, "stream type"
        )
        for ref, problem in problems.items():
            if before.get(ref) != problem:
                log.warning("domain module %s does not load; serving its last good aggregates", problem)
        state.aggregates_by_module, state.aggregate_problems = good, problems
        found = {name: good[ref][name] for name, ref in origin.items()}
        if found.keys() != last.keys() or any(found[k] is not last[k] for k in found):
            state.aggregates = found
            state.aggregates_generation = getattr(state, "aggregates_generation", 0) + 1
            handler = getattr(state, "handler", None)
            if handler is not None:
                handler.aggregates = dict(found)
            state.metrics.known_stream_types(found)
            log.info("serving stream types: %s", ", ".join(sorted(found)) or "none")
        return found


def refresh_definitions(state: State) -> None:
    """Look at the config file, the projection files and the domain modules again (each at most once
    a second), so that `definition_problems` is current."""
    current_projections(state)
    current_aggregates(state)


def definition_problems(state: State) -> dict[str, str]:
    """What did not load when last looked at, by what it is (`/healthz` `problems`): the config file,
    projection files, domain modules; each says that the last good definitions are served. No I/O."""
    out: dict[str, str] = {}
    if getattr(state, "config_problem", None):
        out["config"] = state.config_problem
    for key, problems in (
        ("[projections] modules", getattr(state, "projection_problems", {})),
        ("[eventstore] modules", getattr(state, "aggregate_problems", {})),
    ):
        if problems:
            out[key] = "; ".join(problems.values()) + " (serving the last definitions that loaded)"
    return out


def current_settings(state: State) -> Settings:
    """The app's settings with `[projections]` as the config file says now (the rest as started)."""
    started: Settings = state.settings
    return started.model_copy(update={"projections": current_projection_settings(state)})


def current_run_settings(state: State) -> RunSettings:
    """`RunSettings` for the runner, with the current `[projections]`."""
    from tributary.projections.runner import RunSettings

    return RunSettings.from_settings(current_settings(state), dsn=state.dsn)
