"""The table mirror of a CDC topic equals the table a simple model of the changes keeps."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.projections.helpers import dump
from tributary.log.local import Log, TopicConfig, canonical_json
from tributary.projections.cdc import TOAST_PLACEHOLDER
from tributary.projections.runner import RunSettings, rebuild, run

pytestmark = pytest.mark.integration
TOPIC = "shop.public.orders"


def _envelope(op: str, before: Any, after: Any, ts: int) -> bytes:
    return orjson.dumps(
        {
            "before": before,
            "after": after,
            "op": op,
            "ts_ms": ts,
            "source": {
                "connector": "tributary",
                "name": "shop",
                "db": "shop",
                "schema": "public",
                "table": "orders",
                "lsn": ts,
                "txId": ts,
                "ts_ms": ts,
                "snapshot": "false",
            },
        }
    )


def _changes(log: Log, rng: random.Random, model: dict[int, dict[str, Any]], n: int, ts: list[int]) -> None:
    for _ in range(n):
        ts[0] += 1
        oid = rng.randrange(12)
        key = canonical_json({"id": oid})
        part = log.partition_for(TOPIC, key)
        old = model.get(oid)
        if old is not None and rng.random() < 0.25:
            del model[oid]
            log.append(
                TOPIC,
                part,
                [(key, _envelope("d", old, None, ts[0]), ts[0], None), (key, None, ts[0], None)],
            )
            continue
        note = old["note"] if old is not None and rng.random() < 0.5 else "x" * rng.randrange(1, 40)
        row = {"id": oid, "total": f"{rng.randrange(10**6)}.{rng.randrange(100):02d}", "note": note}
        shipped = {**row, "note": TOAST_PLACEHOLDER} if old is not None and note == old["note"] else row
        model[oid] = row
        log.append(TOPIC, part, [(key, _envelope("u" if old else "c", old, shipped, ts[0]), ts[0], None)])


def test_mirror_equals_model_incrementally_and_rebuilt(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    rng = random.Random(3)
    root = tmp_path / "log"
    log = Log.open(root, writer=True, segment_bytes=4096)
    log.create_topic(TOPIC, TopicConfig(partitions=3))
    s = RunSettings(dsn=fresh_db, log_root=root, mirror=(TOPIC,), spark_master="local[2]", shuffle_partitions=2)
    model: dict[int, dict[str, Any]] = {}
    ts = [1_700_000_000_000]
    for batch in (60, 40):
        _changes(log, rng, model, batch, ts)
        log.commit()
        run("shop_public_orders", s, spark=spark)
    log.close()
    with psycopg.connect(fresh_db) as conn:
        got = {r[0]: r[1] for r in conn.execute("SELECT key, row FROM views.shop_public_orders")}
    assert got == {canonical_json({"id": k}).decode(): v for k, v in model.items()}
    assert not any(TOAST_PLACEHOLDER in str(v) for v in got.values())
    before = dump(fresh_db, "views.shop_public_orders")
    rebuild("shop_public_orders", s, spark=spark)
    assert dump(fresh_db, "views.shop_public_orders") == before
