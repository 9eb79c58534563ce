"""A projection's state as a person reads it, in one place for `project status`, `GET /projections`
and the console: a build's own status stays `done` after its swap while records keep arriving, so
the state shown is worked out from the builds and the lag, never "done" while records wait."""

from __future__ import annotations

__all__ = ["BUSY", "STATES", "projection_state", "state_label"]

BUSY = frozenset({"building", "catching_up", "swapping"})
"""A build's statuses while a rebuild writes it (`projections.builds.status`); a killed rebuild
leaves its build with one of them."""

STATES = ("never run", "building", "failed", "rebuilding", "behind", "done")
"""Every state `projection_state` returns: `never run` (no build yet), `building` (the first build
under way, nothing serving), `failed` (nothing serving, the last build failed or was stopped
unfinished), `rebuilding` (a new build under way while the old one serves), `behind` (serving,
records waiting), `done` (serving, caught up with the log)."""


def projection_state(
    serving: bool, newest: str | None, lag: int, *, locked: bool = False, started: bool = False
) -> str:
    """One of `STATES` from whether a build serves the view, the newest build's status (None when
    there is none), the records waiting in the projection's topics, whether a runner holds the
    projection's lock, and whether a rebuild was started elsewhere (an API rebuild's process, before
    its build row exists). A build left `building` by a killed process holds no lock: it is not
    under way, so the serving build's lag decides, or, with none serving, the state is `failed`."""
    if started or (locked and newest in BUSY):
        return "rebuilding" if serving else "building"
    if not serving:
        return "never run" if newest is None else "failed"
    return "behind" if lag > 0 else "done"


def state_label(state: str, lag: int) -> str:
    """What the console and `project status` print: `behind (162 records)`, else the state."""
    if state == "behind":
        return f"behind ({lag:,} record{'' if lag == 1 else 's'})"
    return state
