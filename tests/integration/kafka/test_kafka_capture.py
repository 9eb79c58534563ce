"""Capture on the Kafka backend, as a user runs it (the CLI, a real Postgres, a Kafka cluster):
the same records as the local log, and exactly once for read_committed consumers across kill -9."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
from pathlib import Path

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import (
    capture_progress,
    cli,
    records,
    source_status,
    spawn_capture,
    wait_for,
    write_config,
)
from tests.integration.kafka.conftest import ON_BROKER, KafkaCluster
from tests.integration.kafka.helpers import read_committed, without_replays, write_kafka_config
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


def _ledger_writer(dsn: str, stop: threading.Event, committed: list[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        i = 0
        while not stop.is_set():
            i += 1
            with conn.transaction():
                conn.execute("INSERT INTO ledger VALUES (%s, %s)", (i, i % 97))
                conn.execute("UPDATE counters SET v = v + 1 WHERE k = %s", (i % 5,))
            committed.append(i)
            time.sleep(0.002)


def test_kill_9_loses_and_duplicates_nothing_for_read_committed(
    fresh_db: str, tmp_path: Path, kafka: KafkaCluster
) -> None:
    kafka.prepare("shop.public.ledger", "shop.public.counters")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE ledger (id int PRIMARY KEY, amount int)")
        conn.execute("CREATE TABLE counters (k int PRIMARY KEY, v int NOT NULL)")
        conn.execute("INSERT INTO counters SELECT g, 0 FROM generate_series(0, 4) g")
    config = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn=fresh_db,
        log_root=tmp_path / "kstatus",
        bootstraps=kafka.bootstraps,
        create_topics=kafka.creates_topics,
    )
    stop, committed = threading.Event(), []
    writer = threading.Thread(target=_ledger_writer, args=(fresh_db, stop, committed))
    writer.start()
    rng = random.Random(7)
    try:
        for _ in range(6):
            proc = spawn_capture(config)
            time.sleep(rng.uniform(1.5, 3.0))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    finally:
        stop.set()
        writer.join()
    final = cli("capture", "--config", str(config), "--until-idle", "2")
    assert final.returncode == 0, final.stderr
    seen = read_committed(kafka.bootstraps, ["shop.public.ledger", "shop.public.counters"])
    in_order = sorted(seen, key=lambda s: (s[0], s[1], s[2]))
    changes = [(t, k, orjson.loads(v)) for t, _, _, k, v, _, _ in in_order if v is not None]
    if not kafka.hides_open_transactions:  # the mock: a kill mid-commit shows what is sent again
        changes, _ = without_replays(changes)
    ledger = [c for t, _, c in changes if t == "shop.public.ledger" and c.get("op") in ("c", "r")]
    ids = [c["after"]["id"] for c in ledger]
    assert len(ids) == len(set(ids)), "a change was seen twice"
    assert sorted(ids) == sorted(committed), "a committed change is missing"
    per_key: dict[int, list[int]] = {}
    for t, _, c in changes:
        if t == "shop.public.counters" and c.get("op") in ("c", "r", "u"):
            per_key.setdefault(c["after"]["k"], []).append(c["after"]["v"])
    for k, values in per_key.items():
        assert values == sorted(set(values)), f"counter {k} out of order or duplicated"
    with psycopg.connect(fresh_db) as conn:
        final_counts = dict(conn.execute("SELECT k, v FROM counters").fetchall())
    assert {k: v[-1] for k, v in per_key.items()} == final_counts  # the compacted state equals the table


def _streaming(status_root: Path, pid: int, source: str) -> bool:
    doc = read_status(status_root) or {}
    return doc.get("pid") == pid and any(
        s["name"] == source and s.get("state") == "streaming" for s in doc.get("sources", [])
    )


def test_captures_of_different_sources_run_side_by_side(fresh_db: str, tmp_path: Path, kafka: KafkaCluster) -> None:
    """Two capture processes, one source each, the same transactional-id prefix: each source has
    its own producer, so neither fences the other; each resumes from its own position."""
    kafka.prepare("shop.public.orders", "crm.public.people")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE people (id int PRIMARY KEY)")
    configs = {}
    for name, table in (("shop", "orders"), ("crm", "people")):
        config = write_kafka_config(
            tmp_path / f"{name}.toml",
            dsn=fresh_db,
            log_root=tmp_path / f"status-{name}",
            bootstraps=kafka.bootstraps,
            create_topics=kafka.creates_topics,
            name=name,
        )
        text = config.read_text().replace('include = ["public.*"]', f'include = ["public.{table}"]')
        configs[name] = config
        config.write_text(re.sub(r'transactional_id = "[^"]*"', 'transactional_id = "shared"', text))
    procs = {name: spawn_capture(config) for name, config in configs.items()}
    try:
        for name, proc in procs.items():
            wait_for(
                lambda name=name, pid=proc.pid: _streaming(tmp_path / f"status-{name}", pid, name),
                timeout=60,
                what=f"{name} streaming",
                progress=lambda name=name: capture_progress(tmp_path / f"status-{name}"),
            )
        for round_ in range(3):
            with psycopg.connect(fresh_db, autocommit=True) as conn:
                for i in range(20):
                    conn.execute("INSERT INTO orders VALUES (%s)", (round_ * 20 + i,))
                    conn.execute("INSERT INTO people VALUES (%s)", (round_ * 20 + i,))
            for name, proc in procs.items():  # each captured the round
                wait_for(
                    lambda name=name, pid=proc.pid, n=20 * (round_ + 1): (
                        source_status(tmp_path / f"status-{name}", pid, name).get("changes", 0) >= n
                    ),
                    what=f"{name} capturing round {round_}",
                    progress=lambda name=name: capture_progress(tmp_path / f"status-{name}"),
                )
            for proc in procs.values():
                assert proc.proc.poll() is None, proc.communicate(5)[1]
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name}: {proc.communicate(5)[1]}"
    for config in configs.values():  # each resumes from its own position: nothing again
        again = cli("capture", "--config", str(config), "--until-idle", "1")
        assert again.returncode == 0, again.stderr
    seen = read_committed(kafka.bootstraps, ["shop.public.orders", "crm.public.people"])
    for topic in ("shop.public.orders", "crm.public.people"):
        ids = [orjson.loads(v)["after"]["id"] for t, _, _, _, v, _, _ in seen if t == topic and v and b'"op":' in v]
        assert sorted(ids) == list(range(60)), topic


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
