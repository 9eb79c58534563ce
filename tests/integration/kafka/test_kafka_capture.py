"""Capture on the Kafka backend where Kafka differs on purpose (its guarantees shared with the local
log are in tests/integration/contract/): the records equal the local log's byte for byte, placed
by Kafka's own partitioner (murmur2) so that Java clients agree; a second capture of a source fences
the first (Kafka's transactional ids; the local log refuses a second writer at open instead)."""

from __future__ import annotations

import signal
from pathlib import Path

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import (
    capture_progress,
    cli,
    records,
    spawn_capture,
    wait_for,
    write_config,
)
from tests.integration.kafka.helpers import read_committed, write_kafka_config
from tests.kafka_fixtures import ON_BROKER, KafkaCluster
from tributary.capture.status import read_status
from tributary.log.local import partition_for

pytestmark = pytest.mark.integration

TOPIC = "shop.public.items"


def _stable(value: bytes | None) -> bytes:
    """A value without its top-level `ts_ms` (when capture processed it: each run's own)."""
    if value is None:
        return b""
    data = orjson.loads(value)
    data.pop("ts_ms", None)
    return orjson.dumps(data)


def _streamed(value: bytes | None) -> bool:
    """A streamed change (a delete's tombstone included), not a snapshot read or a schema record."""
    return value is None or b'"op":' in value and b'"op":"r"' not in value


def test_capture_into_kafka_writes_what_the_local_log_holds(fresh_db: str, tmp_path: Path, kafka: KafkaCluster) -> None:
    kafka.prepare(TOPIC)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO items SELECT g, 'seed ' || g FROM generate_series(1, 50) g")
    local = write_config(tmp_path / "local.toml", dsn=fresh_db, log_root=tmp_path / "local")
    remote = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn=fresh_db,
        log_root=tmp_path / "kstatus",
        bootstraps=kafka.bootstraps,
        create_topics=kafka.creates_topics,
    )
    for config in (local, remote):  # both slots exist before the changes below
        done = cli("capture", "--config", str(config), "--until-idle", "1")
        assert done.returncode == 0, done.stderr
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("INSERT INTO items SELECT g, 'new ' || g FROM generate_series(51, 80) g")
        conn.execute("UPDATE items SET note = note || '!' WHERE id % 7 = 0")
        conn.execute("DELETE FROM items WHERE id % 11 = 0")
    for config in (local, remote):
        done = cli("capture", "--config", str(config), "--until-idle", "1")
        assert done.returncode == 0, done.stderr

    seen = read_committed(kafka.bootstraps, [TOPIC])
    on_kafka = [(p, k, v) for _, p, _, k, v, _, _ in seen]
    on_disk = [(r.key, r.value) for r in records(tmp_path / "local", TOPIC)]
    for partition, key, value in on_kafka:
        if value is None or b'"op":' in value:  # a change (schema records go to every partition)
            assert partition == partition_for(key, 3)  # Kafka's murmur2, as a Java producer places it
    # The streamed changes (same LSNs on both slots) are the same records, byte for byte.
    streamed_kafka = sorted((k, _stable(v)) for _, k, v in on_kafka if _streamed(v))
    streamed_local = sorted((k, _stable(v)) for k, v in on_disk if _streamed(v))
    assert streamed_kafka == streamed_local
    assert len([v for _, v in streamed_kafka if v]) == 30 + 11 + 7  # inserts, updates, deletes
    # Each record once: the snapshot's keys once each, every change once.
    reads = [k for _, k, v in on_kafka if v is not None and b'"op":"r"' in v]
    assert sorted(reads) == sorted(k for k, v in on_disk if v is not None and b'"op":"r"' in v)
    assert len(reads) == len(set(reads)) == 50

    # `log topics` and `log cat` read the Kafka backend as they read the local log.
    listed = cli("log", "topics", "--config", str(remote))
    assert listed.returncode == 0, listed.stderr
    assert f"{TOPIC}\tpartitions=3\tpolicy=broker" in listed.stdout
    cat = cli("log", "cat", TOPIC, "--config", str(remote))
    assert cat.returncode == 0, cat.stderr
    lines = [orjson.loads(line) for line in cat.stdout.splitlines()]
    assert sorted((r["partition"], r["offset"]) for r in lines) == sorted((p, o) for _, p, o, _, _, _, _ in seen)
    tables = []
    for config in (remote, local):
        shown = cli("log", "cat", TOPIC, "--compacted", "--config", str(config))
        assert shown.returncode == 0, shown.stderr
        tables.append(sorted(orjson.dumps(orjson.loads(line)["key"]) for line in shown.stdout.splitlines()))
    assert tables[0] == tables[1]
    assert len([k for k in tables[0] if b"__schema__" not in k]) == 80 - 7  # the table's rows


def _streaming(status_root: Path, pid: int, source: str) -> bool:
    doc = read_status(status_root) or {}
    return doc.get("pid") == pid and any(
        s["name"] == source and s.get("state") == "streaming" for s in doc.get("sources", [])
    )


@ON_BROKER  # the mock neither fences producers nor aborts their transactions (docs/kafka.md)
def test_a_second_capture_of_a_source_fences_the_first(fresh_db: str, tmp_path: Path, kafka: KafkaCluster) -> None:
    kafka.prepare("shop.public.orders")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    config = write_kafka_config(
        tmp_path / "k.toml",
        dsn=fresh_db,
        log_root=tmp_path / "status",
        bootstraps=kafka.bootstraps,
        create_topics=kafka.creates_topics,
    )
    first = spawn_capture(config)
    second = None
    try:
        moving = lambda: capture_progress(tmp_path / "status")  # noqa: E731
        wait_for(
            lambda: _streaming(tmp_path / "status", first.pid, "shop"), what="the first streaming", progress=moving
        )
        second = spawn_capture(config)  # its producer of source "shop" fences the first's
        wait_for(  # a status of its own: past its start, where its producer fenced the first's
            lambda: (read_status(tmp_path / "status") or {}).get("pid") == second.pid,
            what="the second capture's first status",
            progress=moving,
        )
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("INSERT INTO orders VALUES (1)")  # the first's next commit is refused
        assert first.wait(timeout=60) == 1
        err = first.communicate(5)[1].strip().splitlines()[-1]
        assert "source 'shop': another capture process took over its Kafka producer" in err, err
    finally:
        for proc in (first, second):
            if proc is not None and proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)


@ON_BROKER  # the mock does not check that a compacted topic's records have keys
def test_a_truncate_reaches_compacted_kafka_topics(fresh_db: str, tmp_path: Path, kafka: KafkaCluster) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO items SELECT g, 'seed' FROM generate_series(1, 5) g")
    config = write_kafka_config(
        tmp_path / "kafka.toml", dsn=fresh_db, log_root=tmp_path / "k", bootstraps=kafka.bootstraps, create_topics=True
    )
    done = cli("capture", "--config", str(config), "--until-idle", "1")
    assert done.returncode == 0, done.stderr
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("TRUNCATE items")
        conn.execute("INSERT INTO items VALUES (9, 'after')")
    done = cli("capture", "--config", str(config), "--until-idle", "1")
    assert done.returncode == 0, done.stderr

    seen = read_committed(kafka.bootstraps, [TOPIC])
    truncates = sorted((p, k) for _, p, _, k, v, _, _ in seen if v is not None and b'"op":"t"' in v)
    assert truncates == [(0, b""), (1, b""), (2, b"")]  # every partition; a compacted topic needs a key
    assert any(v is not None and b'"op":"c"' in v for *_, v, _, _ in seen)  # capture went on after it
    cat = cli("log", "cat", TOPIC, "--config", str(config))
    assert cat.returncode == 0, cat.stderr
    shown = [orjson.loads(line) for line in cat.stdout.splitlines()]
    assert sorted(r["partition"] for r in shown if r["value"] and r["value"].get("op") == "t") == [0, 1, 2]
    assert all(r["key"] is None for r in shown if r["value"] and r["value"].get("op") == "t")  # as on the local log
