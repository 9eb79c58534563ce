"""The orders projections both the contract suite and the Kafka-only projection tests run: a
`orders` table captured into the log, a DataFrame total, a fold and the table's mirror, and the
views SQL says they should hold."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from tests.integration.capture.helpers import cli
from tests.integration.projections.helpers import dump

if TYPE_CHECKING:
    from tests.backends import LogBackend

TOPIC = "shop.public.orders"
MIRROR = "shop_public_orders"
PROJECTIONS = f'''
from pyspark.sql import functions as F
from tributary.projections.definition import Fold, Projection, Table

TOPIC = "{TOPIC}"


def build(records):
    op = F.expr("variant_get(value_v, '$.op', 'string')")
    rows = records.where((F.col("topic") == TOPIC) & op.isin("r", "c"))
    return rows.groupBy(F.expr("variant_get(value_v, '$.after.customer', 'string')").alias("customer")).agg(
        F.sum(F.expr("variant_get(value_v, '$.after.amount', 'bigint')")).alias("total"),
        F.count(F.lit(1)).alias("n"),
    )


def customer(record):  # inserts and snapshot reads, by customer
    value = record.value
    if value is None or value.get("op") not in ("r", "c"):
        return None
    return value["after"]["customer"]


def initial(key):
    return {{"customer": key, "total": 0, "n": 0, "last": None}}


def apply(state, record):
    after = record.value["after"]
    return {{**state, "total": state["total"] + after["amount"], "n": state["n"] + 1, "last": after["id"]}}


def result(state):
    return {{"customer": state["customer"], "total": state["total"], "n": state["n"]}}


TABLE = Table.of({{"customer": "text", "total": "bigint", "n": "bigint"}}, ["customer"])
PROJECTIONS = [
    Projection(name="order_totals", version=1, topics=(TOPIC,), table=TABLE, build=build),
    Projection(
        name="customer_folds", version=1, topics=(TOPIC,), table=TABLE, key=customer,
        fold=Fold(initial=initial, apply=apply, result=result),
    ),
]
'''
NAMES = ("order_totals", "customer_folds", MIRROR)


def orders_config(tmp_path: Path, dsn: str, backend: LogBackend, projections: str, *, mirror: bool) -> Path:
    """A config capturing a 30-row `orders` table on `backend`, with `projections` as its projection
    file (and the table's mirror, if `mirror`); migrated and captured until idle."""
    from tests.backends import write_backend_config
    from tributary.eventstore.migrate import run_migrations

    backend.prepare(TOPIC)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL, amount int NOT NULL)")
        conn.execute("INSERT INTO orders SELECT g, 'c' || (g % 4), g FROM generate_series(1, 30) g")
    module = tmp_path / "orders_projections.py"
    module.write_text(projections)
    config = write_backend_config(backend, tmp_path / "t.toml", dsn=dsn, log_root=tmp_path / "log")
    text = config.read_text().replace('include = ["public.*"]', 'include = ["public.orders"]')
    mirrors = f'mirror = ["{TOPIC}"]\n' if mirror else ""
    config.write_text(
        f'[service]\ndsn = "{dsn}"\n\n[projections]\nmodules = ["{module}"]\n'
        f'{mirrors}spark_master = "local[2]"\n' + text
    )
    run_migrations(dsn)  # what `tributary init` does: capture and projections refuse before it
    capture_until_idle(config)
    return config


def capture_until_idle(config: Path) -> None:
    done = cli("capture", "--config", str(config), "--until-idle", "1")
    assert done.returncode == 0, done.stderr


def expected_views(dsn: str, inserted: list[tuple[int, str, int]]) -> dict[str, list[str]]:
    """The three views as SQL says they should be: totals of every row inserted (the DataFrame
    and the fold), and the table's current rows (the mirror)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TEMP TABLE inserted (id int, customer text, amount int)")
        with conn.cursor().copy("COPY inserted FROM STDIN") as copy:
            for row in inserted:
                copy.write_row(row)
        totals = [
            r[0]
            for r in conn.execute(
                "SELECT (customer, sum(amount), count(*))::text FROM inserted GROUP BY customer ORDER BY 1"
            )
        ]
        current = [r[0] for r in conn.execute("SELECT (id, customer, amount)::text FROM orders ORDER BY 1")]
    return {"order_totals": totals, "customer_folds": totals, MIRROR: current}


def views(dsn: str) -> dict[str, list[str]]:
    out = {name: dump(dsn, f"views.{name}") for name in NAMES[:2]}
    with psycopg.connect(dsn) as conn:
        out[MIRROR] = [
            r[0] for r in conn.execute(f"SELECT (id, customer, amount)::text FROM views.{MIRROR} ORDER BY 1")
        ]
    return out
