"""Capture's readers of its own topics on Kafka (log/kafka/read.py): the live keys a
re-snapshot reads back equal the local log's for the same records; a re-snapshot after a lost slot
and a chunked re-snapshot delete, exactly once, the rows removed meanwhile; `log cat --follow` and
`log verify` on the Kafka backend."""

from __future__ import annotations

import random
import signal
import subprocess
from pathlib import Path

import orjson
import psycopg
import pytest

from tests import waiting
from tests.integration.capture.helpers import cli
from tests.integration.capture.test_resnapshot import FILL, TABLES, _change_while_slot_gone, _compacted, _table
from tests.kafka_fixtures import ON_BROKER, KafkaCluster
from tests.integration.kafka.helpers import read_committed, write_kafka_config
from tests.pg import REPO_ROOT
from tributary.capture.records.schema_tracker import SCHEMA_KEY
from tributary.log.kafka.options import OFFSETS_TOPIC
from tributary.log.kafka.read import kafka_positions
from tributary.log.kafka.writer import KafkaLog
from tributary.log.local import Log, RecordIn, TopicConfig, partition_for

pytestmark = pytest.mark.integration


def _resnapshot_config(tmp_path: Path, dsn: str, kafka: KafkaCluster, *, chunked: bool = False) -> Path:
    config = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn=dsn,
        log_root=tmp_path / "kstatus",
        bootstraps=kafka.bootstraps,
        create_topics=kafka.creates_topics,
    )
    extra = 'snapshot = "when_needed"'
    if chunked:
        extra += '\nsnapshot_method = "chunked"\nsnapshot_chunk_rows = 400'
    config.write_text(config.read_text().replace('include = ["public.*"]', f'include = ["public.*"]\n{extra}'))
    return config


def _slot(config: Path) -> str:
    return next(line.split('"')[1] for line in config.read_text().splitlines() if line.startswith("slot ="))


def test_live_keys_on_kafka_equal_the_local_logs(kafka: KafkaCluster, tmp_path: Path) -> None:
    """The same records (tombstones, a key written again after its tombstone, schema and keyless
    records, several commits) in a local log and on Kafka: the same live keys, through the
    writers' one contract (`SourceWriter.live_keys`)."""
    topic = "shop.public.mixed"
    kafka.prepare(topic)
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
        if kafka.kind == "mock":  # a broker refuses a keyless record in a compacted topic (capture writes none there)
            batch.append((rng.randrange(3), (None, b'{"keyless":true}', 1_000, None)))
        batches.append(batch)
    local = Log.open(tmp_path / "log", writer=True, fsync=False)
    kafka_log = KafkaLog(kafka.options("live-keys"), ["shop"])
    remote = kafka_log.source("shop")
    try:
        for log in (local, remote):
            log.create_topic(topic, TopicConfig(partitions=3, policy="compact"))
            for batch in batches:
                for partition, record in batch:
                    log.append(topic, partition, [record])
                log.commit()
        # after the commits, records only appended (never committed) are not read back
        for log in (local, remote):
            log.append(topic, 0, [(keys[0], b"uncommitted", 1_000, None), (b'{"id":-1}', b"uncommitted", 1, None)])
        want = local.source("shop").live_keys(topic)
        got = remote.live_keys(topic)
        unknown = [local.live_keys("shop.public.nothing"), remote.live_keys("shop.public.nothing")]
    finally:
        local.close()
        kafka_log.close()
    model: dict[bytes, bool] = {}
    for batch in batches:
        for _, (key, value, _, _) in batch:
            if key is not None and key != SCHEMA_KEY:
                model[key] = value is not None
    assert got == want == {k for k, alive in model.items() if alive}
    assert 0 < len(got) < len(keys)
    assert unknown == [set(), set()]


def test_positions_read_back_as_the_writer_reads_them(kafka: KafkaCluster) -> None:
    kafka.prepare()
    log = KafkaLog(kafka.options("positions"), ["shop", "crm"])
    try:
        log.commit(positions={"shop": "0/10", "crm": "0/20"})
        log.commit(positions={"shop": "0/30"})
        assert kafka_positions(kafka.options("x")) == log.positions() == {"shop": "0/30", "crm": "0/20"}
    finally:
        log.close()


def _deletes_by_key(
    records: list[tuple[str, int, int, bytes | None, bytes | None]],
) -> dict[tuple[str, bytes], int]:
    """How many delete records (op "d") each (topic, key) got (the key's JSON with sorted keys, as
    `_table` spells it), each checked to be followed by its tombstone: the next offset, as both
    are produced one after the other in one transaction."""
    position = {(t, p, o): (k, v) for t, p, o, k, v in records}
    count: dict[tuple[str, bytes], int] = {}
    for t, p, o, k, v in records:
        if v is None or b'"op":"d"' not in v:
            continue
        assert k is not None
        assert position.get((t, p, o + 1)) == (k, None), "a delete is followed by its tombstone"
        key = (t, orjson.dumps(orjson.loads(k), option=orjson.OPT_SORT_KEYS))
        count[key] = count.get(key, 0) + 1
    return count


def _everything(kafka: KafkaCluster, topics: list[str]) -> list[tuple[str, int, int, bytes | None, bytes | None]]:
    return [(t, p, o, k, v) for t, p, o, k, v, _, _ in read_committed(kafka.bootstraps, topics)]


@ON_BROKER  # capture making its topics, as in production
@pytest.mark.parametrize("chunked", [False, True], ids=["consistent", "chunked"])
def test_a_resnapshot_on_kafka_deletes_the_rows_removed_meanwhile_exactly_once(
    fresh_db: str, tmp_path: Path, kafka: KafkaCluster, chunked: bool
) -> None:
    topics = [f"shop.public.{t}" for t in TABLES]
    kafka.prepare(*topics)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for table, ddl in TABLES.items():
            conn.execute(ddl)
            conn.execute(FILL[table].format(n=1500))
    config = _resnapshot_config(tmp_path, fresh_db, kafka, chunked=chunked)
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert not _deletes_by_key(_everything(kafka, topics))
    before = {table: _compacted(config, f"shop.public.{table}") for table in TABLES}

    _change_while_slot_gone(fresh_db, config)
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert "taking a new snapshot" in res.stderr
    gone: set[tuple[str, bytes]] = set()
    for table in TABLES:
        now = _table(fresh_db, table)
        assert _compacted(config, f"shop.public.{table}") == now, table
        gone |= {(f"shop.public.{table}", key) for key in before[table].keys() - now.keys()}
    deleted = _deletes_by_key(_everything(kafka, topics))
    assert gone and set(deleted) == gone, "the rows removed meanwhile, and only those, are deleted"
    assert set(deleted.values()) == {1}, "each delete exactly once"

    # Again, with nothing removed meanwhile: the tombstones dropped those keys, no delete repeats.
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (_slot(config),))
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert "taking a new snapshot" in res.stderr
    assert _deletes_by_key(_everything(kafka, topics)) == deleted
    for table in TABLES:
        assert _compacted(config, f"shop.public.{table}") == _table(fresh_db, table), table


def _produce(kafka: KafkaCluster, topic: str, tid: str, keys: list[bytes]) -> None:
    log = KafkaLog(kafka.options(tid), ["shop"])
    try:
        for i, key in enumerate(keys):
            log.source("shop").append(
                topic, partition_for(key, 3), [(key, b'{"n":' + str(i).encode() + b"}", 1_000 + i, None)]
            )
        log.commit()
    finally:
        log.close()


def _lines(proc: subprocess.Popen[bytes], n: int) -> list[dict[str, object]]:
    """The next `n` lines, however long each takes (a hang is pytest-timeout's to end)."""
    assert proc.stdout is not None
    out = []
    while len(out) < n:
        line = proc.stdout.readline()
        assert line, f"output ended after {len(out)} of {n} lines"
        out.append(orjson.loads(line))
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_log_cat_follow_on_kafka_prints_new_commits_and_ends_cleanly(
    tmp_path: Path, kafka: KafkaCluster, sig: signal.Signals
) -> None:
    topic = "shop.public.follow"
    kafka.make_topics(topic)
    config = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn="postgresql://unused",
        log_root=tmp_path / "kstatus",
        bootstraps=kafka.bootstraps,
        create_topics=kafka.creates_topics,
    )
    _produce(kafka, topic, "follow-1", [b'"a"', b'"b"', b'"a"'])  # keys: JSON, as capture writes them
    proc = subprocess.Popen(
        [
            str(REPO_ROOT / ".venv/bin/tributary"),
            "log",
            "cat",
            topic,
            "--follow",
            "--compacted",
            "--config",
            str(config),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    try:
        first = _lines(proc, 2)  # the compacted view of what is there: the latest of a, b
        assert sorted((r["key"], r["value"]) for r in first) == [("a", {"n": 2}), ("b", {"n": 1})]
        _produce(kafka, topic, "follow-2", [b'"c"', b'"a"'])  # committed later: every record, as it comes
        later = _lines(proc, 2)
        assert sorted((r["key"], r["value"]) for r in later) == [("a", {"n": 1}), ("c", {"n": 0})]
        proc.send_signal(sig)
        waiting.wait_exit(proc, what="log cat --follow to end")
        rest, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert rest == b"" and b"Traceback" not in err


def test_log_verify_on_kafka(fresh_db: str, tmp_path: Path, kafka: KafkaCluster) -> None:
    kafka.prepare("shop.public.items")
    if kafka.creates_topics:  # the offsets topic there, as an operator made it on the mock: capture not run yet
        kafka.create(OFFSETS_TOPIC, 1)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=20))
    config = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn=fresh_db,
        log_root=tmp_path / "kstatus",
        bootstraps=kafka.bootstraps,
        create_topics=kafka.creates_topics,
    )
    text = config.read_text()
    config.write_text(text + text[text.index("[[sources]]") :].replace('name = "shop"', 'name = "crm"'))
    before = cli("log", "verify", "--config", str(config))  # capture never ran for either source
    assert before.returncode == 0, before.stderr
    assert "source shop: no position yet" in before.stdout and "source crm: no position yet" in before.stdout
    config.write_text(text)  # capture runs for shop only
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    position = kafka_positions(kafka.options("v"))["shop"]
    done = cli("log", "verify", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert f"source shop: position {position}, 1 topic(s)" in done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith(f"ok: Kafka at {kafka.bootstraps}")
    refused = cli("log", "verify", "--repair", "--config", str(config))
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        "tributary: --repair applies to the local log: on Kafka the broker repairs its own logs"
    ]


def test_log_verify_on_kafka_without_the_offsets_topic_fails_with_one_line(
    tmp_path: Path, kafka_mock: KafkaCluster
) -> None:
    config = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn="postgresql://unused",
        log_root=tmp_path / "kstatus",
        bootstraps=kafka_mock.bootstraps,
        create_topics=False,
    )
    res = cli("log", "verify", "--config", str(config))
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [
        "problem: no offsets topic '__tributary_offsets': capture has not run against this cluster",
        f"tributary: 1 problem(s) found on Kafka at {kafka_mock.bootstraps}",
    ]
