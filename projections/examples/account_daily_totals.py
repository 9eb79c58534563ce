"""`account_daily_totals`: deposits and withdrawals per account per UTC day (tumbling windows
by event time). Records up to an hour behind their partition still count; later ones update
the day while the watermark is within a day of its end, and are dropped after that."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tributary.projections.definition import Fold, Projection, Table, WindowSpec
from tributary.projections.records import ProjectionRecord, ms_to_iso

__all__ = ["PROJECTION", "make"]

DAY = 86_400_000
HOUR = 3_600_000


def initial(key: Any, start: int, end: int) -> dict[str, Any]:
    return {"id": key, "in": Decimal(0), "out": Decimal(0), "n": 0}


def apply(s: dict[str, Any], r: ProjectionRecord) -> dict[str, Any]:
    event = r.value if isinstance(r.value, dict) else {}
    kind = event.get("type")
    if kind not in ("MoneyDeposited", "MoneyWithdrawn"):
        return s
    amount = Decimal((event.get("data") or {})["amount"])
    side = "in" if kind == "MoneyDeposited" else "out"
    return {**s, side: s[side] + amount, "n": s["n"] + 1}


def result(s: dict[str, Any], start: int, end: int) -> dict[str, Any] | None:
    if s["n"] == 0:
        return None
    return {
        "account_id": s["id"],
        "day": ms_to_iso(start)[:10],
        "deposits": s["in"],
        "withdrawals": s["out"],
        "movements": s["n"],
    }


def make(
    name: str = "account_daily_totals",
    topics: tuple[str, ...] = ("events.account",),
    version: int = 1,
    window: WindowSpec | None = None,
) -> Projection:
    return Projection(
        name=name,
        version=version,
        topics=topics,
        table=Table.of(
            {
                "account_id": "text",
                "day": "date",
                "deposits": "numeric(20,2)",
                "withdrawals": "numeric(20,2)",
                "movements": "integer",
            },
            ["account_id", "day"],
        ),
        fold=Fold(initial=initial, apply=apply, result=result),
        window=window or WindowSpec.tumbling(DAY, lateness=HOUR, late="update", grace=DAY),
        description="deposits and withdrawals per account per day",
    )


PROJECTION = make()
