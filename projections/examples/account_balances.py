"""`account_balances`: one row per bank account from `events.account`, folded in event-time order.

Balance, status, last version, overdraft fees charged (OverdraftFeeCharged events) and
`overdrafts`: how many withdrawals took the balance below zero. Processed by event time, a
deposit made before a withdrawal counts first even when the two travel on different topics
or partitions: arrival order would report a false overdraft there. A deleted account (the
event store's `$stream_deleted` marker, or its key's tombstone) has no row; one recreated after
its delete starts again from its new events.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tributary.projections.definition import Fold, Projection, Table
from tributary.projections.records import ProjectionRecord, ms_to_iso

__all__ = ["PROJECTION", "make"]

ZERO = Decimal("0")


def initial(key: Any) -> dict[str, Any]:
    return {
        "id": key,
        "owner": None,
        "status": "unknown",
        "balance": ZERO,
        "limit": ZERO,
        "fees": ZERO,
        "overdrafts": 0,
        "version": 0,
        "at": None,
    }


def apply(s: dict[str, Any], r: ProjectionRecord) -> dict[str, Any]:
    event = r.value
    kind = event.get("type") if isinstance(event, dict) else None
    if event is None or kind == "$stream_deleted":  # the stream was deleted: forget it
        return {**initial(s["id"]), "status": "deleted"}
    if not isinstance(event, dict):
        return s
    data = event.get("data") or {}
    s = dict(s)
    if kind == "AccountOpened":
        s.update(
            owner=data.get("owner"),
            status="open",
            limit=Decimal(str(data.get("overdraft_limit", "0"))),
        )
    elif kind == "MoneyDeposited":
        s["balance"] += Decimal(data["amount"])
    elif kind == "MoneyWithdrawn":
        was = s["balance"]
        s["balance"] = was - Decimal(data["amount"])
        if s["balance"] < ZERO <= was:
            s["overdrafts"] += 1
    elif kind == "OverdraftFeeCharged":
        s["balance"] -= Decimal(data["amount"])
        s["fees"] += Decimal(data["amount"])
    elif kind == "AccountClosed":
        s["status"] = "closed"
    s["version"] = max(s["version"], int(event.get("version") or 0))
    s["at"] = r.event_time
    return s


def result(s: dict[str, Any]) -> dict[str, Any] | None:
    if s["status"] == "deleted":
        return None
    return {
        "account_id": s["id"],
        "owner": s["owner"],
        "status": s["status"],
        "balance": s["balance"],
        "overdraft_limit": s["limit"],
        "fees_charged": s["fees"],
        "overdrafts": s["overdrafts"],
        "last_version": s["version"],
        "updated_at": None if s["at"] is None else ms_to_iso(s["at"]),
    }


TABLE = Table.of(
    {
        "account_id": "text",
        "owner": "text",
        "status": "text",
        "balance": "numeric(20,2)",
        "overdraft_limit": "numeric(20,2)",
        "fees_charged": "numeric(20,2)",
        "overdrafts": "integer",
        "last_version": "bigint",
        "updated_at": "timestamptz",
    },
    ["account_id"],
)


def make(name: str = "account_balances", topics: tuple[str, ...] = ("events.account",), version: int = 1) -> Projection:
    """The projection over other topics (tests feed deposits and withdrawals on two)."""
    return Projection(
        name=name,
        version=version,
        topics=topics,
        table=TABLE,
        fold=Fold(initial=initial, apply=apply, result=result),
        description="balance, status and fees per account",
    )


PROJECTION = make()
