"""The projections a running API serves, as the config file and the projection files say *now*.

`tributary serve` runs for weeks while users add `[projections] modules` and edit projection files:
`/projections`, `/views` and rebuilds must see those changes without a restart. Reading is cheap:
one `stat` of the config file and of each projection file (at most once a second for `/views`); a
file is read again only when its stamp (mtime, size) changed.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from tributary.api.settings.config import DEFAULT_CONFIG, ConfigError, ProjectionSettings, load_settings

__all__ = [
    "config_file",
    "current_projection_settings",
    "current_projections",
    "current_run_settings",
    "current_settings",
]

log = logging.getLogger(__name__)
RECHECK_S = 1.0  # how stale the definitions `/views` serves may be
_lock = threading.Lock()


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def config_file(config: Path | None) -> Path | None:
    """The file `load_settings(config)` reads (absolute, so a later chdir does not matter), if any:
    set it as `app.state.config_path` and the app follows its `[projections]`."""
    path = config if config is not None else DEFAULT_CONFIG
    return path.resolve() if path.exists() else None


def current_projection_settings(state: Any) -> ProjectionSettings:
    """`[projections]` from the config file the app was started with (`state.config_path`), read
    again when the file changed; the start-up settings when there is no file or it no longer loads."""
    path: Path | None = getattr(state, "config_path", None)
    if path is None:
        return state.settings.projections  # type: ignore[no-any-return]
    stamp = _stamp(path)
    with _lock:
        if getattr(state, "config_stamp", None) == stamp:
            return state.projection_settings  # type: ignore[no-any-return]
        projections = getattr(state, "projection_settings", state.settings.projections)
        if stamp is not None:
            try:
                projections = load_settings(path).projections
            except ConfigError as exc:  # keep serving what loaded last; say why once per change
                log.warning("config file %s changed but does not load (%s); keeping its last [projections]", path, exc)
        state.config_stamp, state.projection_settings = stamp, projections
        return projections  # type: ignore[no-any-return]


def current_projections(state: Any) -> dict[str, Any]:
    """Every configured projection by name, from the files as they were at most `RECHECK_S` ago
    (the views route calls this per request: the `stat`s are paid once per interval, not per page)."""
    from tributary.projections.loader import load_current

    now = time.monotonic()
    last: dict[str, Any] | None = getattr(state, "last_projections", None)
    if last is not None and now - getattr(state, "projections_checked_at", 0.0) < RECHECK_S:
        return last
    state.projections_checked_at = now
    pr = current_projection_settings(state)
    try:
        found = load_current(tuple(pr.modules), tuple(pr.mirror))
    except Exception as exc:  # noqa: BLE001 - a file saved half-way: keep serving what loaded last
        if last is None:
            raise
        log.warning("a projection file does not load (%s: %s); serving its last definitions", type(exc).__name__, exc)
        return last
    state.last_projections = found
    return found


def current_settings(state: Any) -> Any:
    """The app's settings with `[projections]` as the config file says now."""
    return state.settings.model_copy(update={"projections": current_projection_settings(state)})


def current_run_settings(state: Any) -> Any:
    """`RunSettings` for the runner, with the current `[projections]`."""
    from tributary.projections.runner import RunSettings

    return RunSettings.from_settings(current_settings(state), dsn=state.dsn)
