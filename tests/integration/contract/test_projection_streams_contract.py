"""Derived streams on every log backend: a fold that emits a record per order to a topic of the
log (real capture, real Spark, real Postgres), read back as a read_committed reader sees it.
Incremental runs add each order's record once; a run that dies between the log's commit and the
database's leaves the stream holding each record once after the next run; another projection
reads the stream; a rebuild writes the same stream to a topic of its own."""

# ruff: noqa: F811  # `spark`, imported below, is the tests' parameter

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.backends import LogBackend
from tests.integration.capture.helpers import cli
from tests.integration.projections.conftest import spark  # noqa: F401  # the suite's one SparkSession
from tests.integration.projections.helpers import dump
from tests.integration.projections.orders_views import TOPIC, capture_until_idle, orders_config
from tributary.api.settings.config import load_settings
from tributary.projections.runner import RunSettings, rebuild, run, status
from tributary.projections.store import Store

pytestmark = pytest.mark.integration

OUT = "order_stream_out"
STREAM = f'''
from tributary.projections.definition import Emit, Fold, Projection, Table


def customer(record):  # inserts and snapshot reads, by customer
    value = record.value
    if value is None or value.get("op") not in ("r", "c"):
        return None
    return value["after"]["customer"]


def apply(state, record):
    after = record.value["after"]
    return {{**state, "total": state["total"] + after["amount"], "last": after["id"], "amount": after["amount"]}}


def emitted(state, record):  # one record per order: the order and its customer's running total
    return [(state["customer"], {{"order": state["last"], "amount": state["amount"], "total": state["total"]}})]


def latest(state, record):  # another projection reading the stream: each customer's latest total
    return {{"customer": record.key, "total": record.value["total"]}}


TOTALS = Projection(
    name="stream_totals", version=1, topics=("{OUT}",), table=Table.of({{"customer": "text", "total": "bigint"}}, ["customer"]),
    fold=Fold(initial=lambda key: None, apply=latest, result=lambda s: s),
)
PROJECTION = Projection(
    name="order_stream", version=1, topics=("{TOPIC}",), key=customer,
    table=Table.of({{"customer": "text", "total": "bigint"}}, ["customer"]),
    fold=Fold(
        initial=lambda key: {{"customer": key, "total": 0, "last": None, "amount": 0}},
        apply=apply,
        result=lambda s: {{"customer": s["customer"], "total": s["total"]}},
    ),
    emit=Emit("{OUT}", emitted),
)
PROJECTIONS = [PROJECTION, TOTALS]
'''


def _setup(tmp_path: Path, dsn: str, backend: LogBackend) -> Path:
    return orders_config(tmp_path, dsn, backend, STREAM, mirror=False)


def _stream(backend: LogBackend, log_root: Path, topic: str) -> list[tuple[str, dict[str, Any]]]:
    """The topic's records as (customer, value), as a read_committed reader gets them."""
    out = []
    for r in backend.records(log_root, topic):
        assert r.key is not None and r.value is not None
        out.append((orjson.loads(r.key), orjson.loads(r.value)))
    return out


def _orders(stream: list[tuple[str, dict[str, Any]]]) -> Counter[tuple[str, int, int]]:
    return Counter((customer, v["order"], v["amount"]) for customer, v in stream)


def _inserted(dsn: str) -> Counter[tuple[str, int, int]]:
    with psycopg.connect(dsn) as conn:
        return Counter(conn.execute("SELECT customer, id, amount FROM orders").fetchall())


def _insert(dsn: str, config: Path, lo: int, hi: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO orders SELECT g, 'c' || (g %% 5), g * 10 FROM generate_series(%s::int, %s::int) g", (lo, hi)
        )
    capture_until_idle(config)


def test_a_fold_emits_each_record_once_across_runs_crashes_and_rebuilds(
    fresh_db: str, tmp_path: Path, backend: LogBackend, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _setup(tmp_path, fresh_db, backend)
    s = RunSettings.from_settings(load_settings(config))
    log_root = tmp_path / "log"

    assert rebuild("order_stream", s, spark=spark).rebuilt
    first = _stream(backend, log_root, OUT)
    assert _orders(first) == _inserted(fresh_db)  # each order's record, once

    _insert(fresh_db, config, 31, 45)
    assert run("order_stream", s, spark=spark).records > 0
    assert _orders(_stream(backend, log_root, OUT)) == _inserted(fresh_db)

    _insert(fresh_db, config, 46, 52)

    def crash(*args: Any, **kwargs: Any) -> int:
        raise RuntimeError("died between the log's commit and the database's")

    with monkeypatch.context() as m:  # the pass dies after its records and position reached the log
        m.setattr(Store, "commit_folds", crash)
        with pytest.raises(RuntimeError, match="died between"):
            run("order_stream", s, spark=spark)
    assert _orders(_stream(backend, log_root, OUT)) == _inserted(fresh_db)  # the log has them
    assert {st.name: st.lag for st in status(s)}["order_stream"] > 0  # the table does not
    assert run("order_stream", s, spark=spark).records > 0  # the table's pass again: the stream unchanged
    incremental = _stream(backend, log_root, OUT)
    assert _orders(incremental) == _inserted(fresh_db)
    with psycopg.connect(fresh_db) as conn:
        totals = conn.execute(
            "SELECT (customer, sum(amount))::text FROM orders GROUP BY customer ORDER BY 1"
        ).fetchall()
    assert dump(fresh_db, "views.order_stream") == [t[0] for t in totals]
    last = {customer: v["total"] for customer, v in incremental}  # each partition in order: its last total
    assert sorted(f"({c},{t})" for c, t in last.items()) == [t[0] for t in totals]
    assert rebuild("stream_totals", s, spark=spark).records > 0  # another projection reads the stream
    assert dump(fresh_db, "views.stream_totals") == [t[0] for t in totals]

    assert {st.name: st.stream for st in status(s)}["order_stream"] == OUT
    again = rebuild("order_stream", s, spark=spark)  # a new build writes a topic of its own
    assert again.build == 2
    assert {st.name: st.stream for st in status(s)}["order_stream"] == f"{OUT}.v1_2"  # where readers go next

    def records(stream: list[tuple[str, dict[str, Any]]]) -> list[bytes]:
        return sorted(map(orjson.dumps, stream))  # partitions may be read in any order

    assert records(_stream(backend, log_root, OUT)) == records(incremental)  # the old stream unchanged
    assert records(_stream(backend, log_root, f"{OUT}.v1_2")) == records(incremental)  # the same stream


def test_on_the_local_log_a_run_emits_while_capture_runs(fresh_db: str, tmp_path: Path, spark: Any) -> None:
    """The projection's writer is a topic owner of its own beside capture's: no need to stop capture."""
    import signal

    from tests.backends import LocalBackend
    from tests.integration.capture.helpers import spawn_capture, table_state, wait_for

    config = _setup(tmp_path, fresh_db, LocalBackend())
    s = RunSettings.from_settings(load_settings(config))
    root = tmp_path / "log"

    def captured() -> bool:
        return len(table_state(root, TOPIC)) == sum(_inserted(fresh_db).values())

    capture = spawn_capture(config)
    try:
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("INSERT INTO orders SELECT g, 'c' || (g % 5), g * 10 FROM generate_series(31, 40) g")
        wait_for(captured, 120, "capture to stream the new orders")  # it runs: it holds capture's lock
        assert rebuild("order_stream", s, spark=spark).rebuilt
        assert _orders(_stream(LocalBackend(), root, OUT)) == _inserted(fresh_db)  # each order's record, once
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("INSERT INTO orders SELECT g, 'c' || (g % 5), g * 10 FROM generate_series(41, 55) g")
        wait_for(captured, 120, "capture to stream more orders")
        assert run("order_stream", s, spark=spark).records > 0
        assert _orders(_stream(LocalBackend(), root, OUT)) == _inserted(fresh_db)  # the new ones once
        assert capture.proc.poll() is None, capture.err_path.read_text()  # capture ran all along
    finally:
        capture.send_signal(signal.SIGTERM)
        capture.wait(timeout=60)
    shown = cli("project", "status", "order_stream", "--config", str(config))  # where readers find it
    assert shown.returncode == 0, shown.stderr
    assert f"stream={OUT}" in shown.stdout, shown.stdout
