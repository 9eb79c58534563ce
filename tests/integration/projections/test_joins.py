"""A stream–table join through real capture and Spark: orders with their customer's name, as of
each order's change, equal to the SQL join once every order changed after its customer; an
incremental run equals a rebuild byte for byte."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.capture.helpers import cli, write_config
from tests.integration.projections.helpers import LogWriter, capture_until_idle, dump, run_sql
from tributary.projections.runner import RunSettings, rebuild, run, status

pytestmark = pytest.mark.integration
HERE = Path(__file__).parent
VIEW = "views.orders_named"
JOINED = "SELECT o.id, o.customer_id, c.name FROM public.orders o LEFT JOIN public.customers c ON c.id = o.customer_id"


def _settings(dsn: str, root: Path) -> RunSettings:
    return RunSettings(
        dsn=dsn,
        log_root=root,
        modules=(str(HERE / "join_projections.py"),),
        spark_master="local[2]",
        shuffle_partitions=2,
    )


def _rows(dsn: str, query: str) -> dict[int, tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return {r[0]: tuple(r) for r in conn.execute(query)}


def test_orders_see_their_customer_as_of_the_order_and_equal_the_sql_join(
    spark: Any, fresh_db: str, tmp_path: Path
) -> None:
    run_sql(
        fresh_db,
        "CREATE TABLE public.customers (id int PRIMARY KEY, name text)",
        "CREATE TABLE public.orders (id int PRIMARY KEY, customer_id int, total numeric(12,2))",
    )
    config = write_config(
        tmp_path / "t.toml",
        dsn=fresh_db,
        log_root=tmp_path / "log",
        source_extra='snapshot = "never"',
        extra=f'[service]\ndsn = "{fresh_db}"',
    )
    init = cli("init", "--config", str(config))
    assert init.returncode == 0, init.stdout + init.stderr
    s = _settings(fresh_db, tmp_path / "log")
    run_sql(
        fresh_db,
        "INSERT INTO customers SELECT i, 'customer ' || i FROM generate_series(1, 5) i",
        "INSERT INTO orders SELECT i, i % 5 + 1, i FROM generate_series(1, 20) i",
        "INSERT INTO orders VALUES (21, 9, 1)",  # customer 9 does not exist yet
    )
    capture_until_idle(config)
    run("orders_named", s, spark=spark)
    assert _rows(fresh_db, f"SELECT * FROM {VIEW}") == _rows(fresh_db, JOINED)

    run_sql(
        fresh_db,
        "UPDATE customers SET name = 'renamed' WHERE id = 2",  # after its orders 1, 6, 11, 16
        "INSERT INTO orders VALUES (22, 2, 1)",
        "INSERT INTO customers VALUES (9, 'late customer')",
        "DELETE FROM customers WHERE id = 5",
        "UPDATE orders SET total = total + 1 WHERE id IN (4, 9)",  # customer 5's, after its delete
    )
    capture_until_idle(config)
    done = run("orders_named", s, spark=spark)
    assert not done.rebuilt and done.records > 0
    view = _rows(fresh_db, f"SELECT * FROM {VIEW}")
    assert view[1] == (1, 2, "customer 2") and view[22] == (22, 2, "renamed")  # as of the order
    assert view[21] == (21, 9, None)  # its customer came later, and the order did not change since
    assert view[4] == (4, 5, None) and view[14] == (14, 5, "customer 5")

    run_sql(fresh_db, "UPDATE orders SET total = total")  # every order changes after every customer
    capture_until_idle(config)
    run("orders_named", s, spark=spark)
    assert _rows(fresh_db, f"SELECT * FROM {VIEW}") == _rows(fresh_db, JOINED)
    incremental = dump(fresh_db, VIEW)
    [st] = status(s, "orders_named")
    assert st.lag == 0

    rebuild("orders_named", s, spark=spark)
    assert dump(fresh_db, VIEW) == incremental


def test_a_table_record_ordered_before_applied_orders_recomputes_them(
    spark: Any, fresh_db: str, tmp_path: Path
) -> None:
    w = LogWriter(tmp_path / "log")
    w.topic("events.order")
    w.topic("events.customer")
    w.append("events.customer", "c1", 1, "CustomerNamed", 100, name="A")
    w.append("events.order", "o1", 1, "OrderPlaced", 200, customer="c1")
    w.commit()
    s = _settings(fresh_db, tmp_path / "log")
    run("order_events_named", s, spark=spark)
    assert dump(fresh_db, "views.order_events_named") == ["(o1,A)"]
    # committed after the order was applied, but its event time puts it before the order
    w.append("events.customer", "c1", 2, "CustomerNamed", 150, name="B")
    w.append("events.order", "o2", 1, "OrderPlaced", 300, customer="c1")
    w.commit()
    w.close()
    done = run("order_events_named", s, spark=spark)
    assert done.recomputed >= 1
    incremental = dump(fresh_db, "views.order_events_named")
    assert incremental == ["(o1,B)", "(o2,B)"]
    rebuild("order_events_named", s, spark=spark)
    assert dump(fresh_db, "views.order_events_named") == incremental
