"""The capture writer's contract (tributary.log.contracts) on every backend, through the product's
own `open_writer` / `open_admin`: what a commit makes visible, the live keys a re-snapshot reads
back, and the positions committed with the records."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest

from tests.backends import LogBackend, admin, writer
from tributary.capture.records.schema_tracker import SCHEMA_KEY
from tributary.log import TopicConfig
from tributary.log.local import RecordIn, partition_for

pytestmark = pytest.mark.integration


def test_live_keys_are_the_keys_whose_latest_committed_record_is_no_tombstone(
    tmp_path: Path, backend: LogBackend
) -> None:
    """Tombstones, a key written again after its tombstone, schema records and several commits;
    records only appended (never committed) are not read back; an unknown topic has none."""
    topic = "shop.public.mixed"
    backend.prepare(topic)
    rng = random.Random(21)
    keys = [orjson.dumps({"id": i}) for i in range(300)]
    batches: list[list[tuple[int, RecordIn]]] = []
    for _ in range(6):
        batch: list[tuple[int, RecordIn]] = []
        for _ in range(400):
            key = rng.choice(keys)
            value = None if rng.random() < 0.3 else b'{"op":"u"}'
            batch.append((partition_for(key, 3), (key, value, 1_000, None)))  # a key's partition, always
        batch.append((rng.randrange(3), (SCHEMA_KEY, b'{"schema":1}', 1_000, None)))
        batches.append(batch)
    log = writer(backend, tmp_path / "log", ["shop"], "live-keys")
    try:
        shop = log.source("shop")
        shop.create_topic(topic, TopicConfig(partitions=3, policy="compact"))
        for batch in batches:
            for partition, record in batch:
                shop.append(topic, partition, [record])
            log.commit()
        shop.append(topic, 0, [(keys[0], b"uncommitted", 1_000, None), (b'{"id":-1}', b"uncommitted", 1, None)])
        got = shop.live_keys(topic)
        unknown = shop.live_keys("shop.public.nothing")
    finally:
        log.close()
    model: dict[bytes, bool] = {}
    for batch in batches:
        for _, (key, value, _, _) in batch:
            if key is not None and key != SCHEMA_KEY:
                model[key] = value is not None
    assert got == {k for k, alive in model.items() if alive}
    assert 0 < len(got) < len(keys)
    assert unknown == set()


def test_positions_committed_are_read_back_by_the_writer_and_the_admin(tmp_path: Path, backend: LogBackend) -> None:
    """Each commit's positions replace those of the same name; other names stay."""
    backend.prepare()
    log = writer(backend, tmp_path / "log", ["shop", "crm"], "positions")
    try:
        log.commit(positions={"shop": "0/10", "crm": "0/20"})
        log.commit(positions={"shop": "0/30"})
        from_writer = log.source("shop").positions()
    finally:
        log.close()
    assert from_writer == admin(backend, tmp_path / "log").positions() == {"shop": "0/30", "crm": "0/20"}


def test_a_second_writer_commits_its_own_topic_while_capture_s_writer_is_open(
    tmp_path: Path, backend: LogBackend
) -> None:
    """`open_writer(owner=…)` beside capture's writer (the local log: a topic owner of its own;
    Kafka: another transactional producer): commits interleave, each writer's records and
    positions are its own, a reader sees both topics."""
    from tributary.log import open_writer

    backend.prepare("shop.public.orders", "derived.orders")
    root = tmp_path / "log"
    capture = writer(backend, root, ["shop"], "capture")
    try:
        second = open_writer(
            root=root, kafka=backend.kafka_options("second"), sources=["derived"], owner="projection.derived.1"
        )
        try:
            shop, derived = capture.source("shop"), second.source("derived")
            shop.create_topic("shop.public.orders", TopicConfig(partitions=3))
            derived.create_topic("derived.orders", TopicConfig(partitions=2))
            for i in range(5):
                shop.append("shop.public.orders", i % 3, [(orjson.dumps({"id": i}), b'{"op":"c"}', 1_000 + i, None)])
                capture.commit(positions={"shop": f"0/{i}"})
                derived.append("derived.orders", i % 2, [(orjson.dumps({"n": i}), b'{"total":1}', 2_000 + i, None)])
                derived.commit(positions={"derived": str(i)})
            assert derived.positions()["derived"] == "4" and shop.positions()["shop"] == "0/4"
        finally:
            second.close()
    finally:
        capture.close()
    assert sorted(orjson.loads(r.key or b"")["id"] for r in backend.records(root, "shop.public.orders")) == list(
        range(5)
    )
    assert sorted(orjson.loads(r.key or b"")["n"] for r in backend.records(root, "derived.orders")) == list(range(5))
