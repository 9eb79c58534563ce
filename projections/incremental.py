"""Incremental DataFrame projections: which ones may merge partial aggregates, and the SQL merge.

A DataFrame projection that declares `merge` (one entry per column outside the primary key)
returns per-key *partial* aggregates of the records it is given; a run hands it only the records
past the checkpoints and merges its rows into the table, in the checkpoints' transaction. That is
exact only when every record the table reflects stays an addition: event topics (`events.*`) are
append-only, a CDC topic's updates and deletes would have to retract the old values. So a
projection runs incrementally only when it declares a merge and reads event topics alone; any
other recomputes over the whole log, and `mode` says why.

A run's new records are mostly few: reading them with Spark tasks (split planning, Python
workers, a shuffle over the task slots) costs seconds whatever their number. Up to
`DRIVER_READ_RECORDS` of them the driver reads them itself (`source.read_range`) and hands `build`
an in-memory frame of the same schema (`source.driver_frame`).
"""

from __future__ import annotations

from psycopg import sql

from tributary.projections.definition import Projection

__all__ = [
    "DRIVER_READ_RECORDS",
    "INCREMENTAL",
    "MERGES",
    "merge_expression",
    "mode",
    "recompute_reason",
]

INCREMENTAL = "incremental"
DRIVER_READ_RECORDS = 100_000  # `[projections] driver_read_records`: the default when not configured
MERGES = {
    # Spark's sum/min/max are NULL over no values: a side that is NULL leaves the other
    "sum": "COALESCE({old} + {new}, {old}, {new})",
    "count": "COALESCE({old} + {new}, {old}, {new})",
    "min": "LEAST({old}, {new})",  # Postgres' LEAST/GREATEST ignore NULLs
    "max": "GREATEST({old}, {new})",
}


def recompute_reason(p: Projection) -> str | None:
    """Why a DataFrame projection's runs recompute over the whole log; None when they merge the
    new records' partial aggregates (and for folds, which resume per unit)."""
    if p.build is None:
        return None
    if not p.merge:
        return "no merge declared"
    cdc = [t for t in p.topics if not t.startswith("events.")]
    if cdc:
        return f"{cdc[0]} is a CDC topic: its updates and deletes do not decompose"
    return None


def mode(p: Projection) -> str:
    """What `project status` and GET /projections show: `incremental` or `recomputes: <why>`."""
    reason = recompute_reason(p)
    return INCREMENTAL if reason is None else f"recomputes: {reason}"


def merge_expression(column: str, how: str) -> sql.Composable:
    """`how` for `column` as SQL over the stored row `old` and the partial aggregate `new`:
    a named merge (`MERGES`), else the user's own expression, as written."""
    template = MERGES.get(how.strip().lower())
    if template is None:
        return sql.SQL(how)  # the projection's author's SQL (`old.total + new.total`)
    ident = sql.Identifier(column)
    return sql.SQL(template).format(old=sql.SQL("old.{}").format(ident), new=sql.SQL("new.{}").format(ident))
