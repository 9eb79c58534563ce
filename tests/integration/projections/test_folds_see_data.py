"""Folds see data, not plumbing: schema records reach only projections that ask for them, and a
`key` function returning None drops the record — through real log files, Parquet copies and Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.projections.schema_projections import TOPIC
from tributary.log.local import Log, TopicConfig, canonical_json
from tributary.projections.runner import RunSettings, rebuild, run

pytestmark = pytest.mark.integration

MODULE = str(Path(__file__).with_name("schema_projections.py"))
SCHEMA_KEY = b'{"__schema__":true}'
PARTITIONS = 2


def _schema(columns: list[tuple[str, str]], ts: int) -> bytes:
    body = {
        "schema": {
            "connector": "tributary",
            "name": "shop",
            "schema": "public",
            "table": "orders",
            "key": ["id"],
            "columns": [{"name": n, "type": t, "typeoid": 0} for n, t in columns],
        },
        "ts_ms": ts,
    }
    return orjson.dumps(body)


def _order(oid: int, customer: str | None, ts: int) -> bytes:
    after = {"id": oid, "customer": customer, "total": f"{oid}.50"}
    return orjson.dumps({"before": None, "after": after, "op": "c", "ts_ms": ts, "source": {"ts_ms": ts}})


def _write(log: Log, first: int, n: int, columns: list[tuple[str, str]]) -> None:
    """A schema record on every partition (as capture writes one), then `n` orders; every fifth
    order has no customer."""
    ts = 1_700_000_000_000 + first
    for part in range(PARTITIONS):
        log.append(TOPIC, part, [(SCHEMA_KEY, _schema(columns, ts), ts, None)])
    for oid in range(first, first + n):
        key = canonical_json({"id": oid})
        customer = None if oid % 5 == 0 else f"c{oid % 7}"
        log.append(TOPIC, log.partition_for(TOPIC, key), [(key, _order(oid, customer, ts + oid), ts + oid, None)])
    log.commit()


def _rows(dsn: str, view: str) -> dict[Any, Any]:
    with psycopg.connect(dsn) as conn:
        return {r[0]: tuple(r[1:]) for r in conn.execute(f"SELECT * FROM views.{view}")}  # noqa: S608


def _expected_counts(n: int) -> dict[str, tuple[int]]:
    out: dict[str, int] = {}
    for oid in range(n):
        if oid % 5:
            out[f"c{oid % 7}"] = out.get(f"c{oid % 7}", 0) + 1
    return {k: (v,) for k, v in out.items()}


def test_folds_and_transforms_see_rows_only_unless_they_ask(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    root = tmp_path / "log"
    log = Log.open(root, writer=True, segment_bytes=4096)  # small segments: Parquet copies and row splits
    log.create_topic(TOPIC, TopicConfig(partitions=PARTITIONS))
    columns = [("id", "integer"), ("customer", "text"), ("total", "numeric(10,2)")]
    _write(log, 0, 150, columns)
    s = RunSettings(dsn=fresh_db, log_root=root, modules=(MODULE,), spark_master="local[2]", shuffle_partitions=2)
    for name in ("per_order", "per_customer", "schemas_seen", "orders_by_op"):
        rebuild(name, s, spark=spark)
    # a column is added: capture writes the new schema record, then rows; incremental runs
    _write(log, 150, 50, [*columns, ("note", "text")])
    log.close()
    for name in ("per_order", "per_customer", "schemas_seen", "orders_by_op"):
        run(name, s, spark=spark)

    per_order = _rows(fresh_db, "per_order")
    assert len(per_order) == 200 and None not in per_order
    assert _rows(fresh_db, "per_customer") == _expected_counts(200)  # no NULL key, no failed job
    assert _rows(fresh_db, "orders_by_op") == {"c": (200,)}  # no schema record among the rows
    # the projection that asked saw every schema record (one per partition per change), in order
    assert _rows(fresh_db, "schemas_seen") == {TOPIC: ("id,customer,total,note", 2 * PARTITIONS)}
