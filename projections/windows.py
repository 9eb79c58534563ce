"""Event-time windows, the watermark and late-event policy, as pure functions.

The watermark a record is judged by is *its partition's* maximum event time over the records
before it (by offset) minus the allowed lateness — a function of the log alone, so a rebuild and
any split into incremental runs judge every record the same way. (A single global watermark,
as Structured Streaming keeps, depends on which partitions a micro-batch happened to cover.)
A window is closed once the watermark reaches its end; a record for a closed window is late:
policy `drop` discards it, `update` still applies it while the watermark is within `grace` of
the window's end.
"""

from __future__ import annotations

from collections.abc import Iterable

from tributary.projections.definition import WindowSpec

__all__ = [
    "admit",
    "assign",
    "running_max_before",
    "session_bounds",
    "split_sessions",
    "watermark",
]

Window = tuple[int, int]


def assign(spec: WindowSpec, event_time: int) -> list[Window]:
    """The [start, end) windows an event time falls in (tumbling: one; hopping: size/hop)."""
    if spec.kind == "tumbling":
        start = (event_time // spec.size) * spec.size
        return [(start, start + spec.size)]
    if spec.kind == "hopping":
        last = (event_time // spec.hop) * spec.hop
        first = ((event_time - spec.size) // spec.hop + 1) * spec.hop
        return [(s, s + spec.size) for s in range(first, last + 1, spec.hop)]
    raise ValueError("session windows are found by split_sessions, not assigned per record")


def watermark(max_before: int | None, lateness: int) -> int | None:
    """Max event time seen before this record (in its partition) − lateness; None = nothing seen."""
    return None if max_before is None else max_before - lateness


def admit(spec: WindowSpec, window_end: int, wm: int | None) -> bool:
    """Does a record count towards a window ending at `window_end`, given its watermark?"""
    if wm is None or window_end > wm:
        return True  # window still open
    if spec.late == "update":
        return window_end + spec.grace > wm
    return False


def session_bounds(spec: WindowSpec, event_time: int) -> Window:
    """The session a lone record would open: [t, t + gap)."""
    return (event_time, event_time + spec.gap)


def split_sessions(event_times: Iterable[int], gap: int) -> list[Window]:
    """Sorted event times → sessions [first, last + gap); a gap of >= `gap` starts a new one."""
    out: list[Window] = []
    for t in event_times:
        if out and t < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], t + gap))
        else:
            out.append((t, t + gap))
    return out


def running_max_before(event_times: Iterable[int], base: int | None = None) -> list[int | None]:
    """For records in offset order: the max event time of the ones before each (and `base`)."""
    out: list[int | None] = []
    cur = base
    for t in event_times:
        out.append(cur)
        cur = t if cur is None or t > cur else cur
    return out
