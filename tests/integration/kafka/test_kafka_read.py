"""Capture's readers of its own topics on Kafka (log/kafka/read.py), where Kafka differs from the
local log: a re-snapshot after a lost slot and a chunked re-snapshot delete, exactly once, the rows
removed meanwhile (read back with Kafka's own consumer, commit markers and all); `log verify` checks
the offsets topic and the sources' positions (the broker checks its own records) and refuses
`--repair`. Live keys, positions and `log cat --follow` are in tests/integration/contract/."""

from __future__ import annotations

from pathlib import Path

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import cli
from tests.integration.capture.test_resnapshot import FILL, TABLES, _change_while_slot_gone, _compacted, _table
from tests.integration.kafka.helpers import read_committed, write_kafka_config
from tests.kafka_fixtures import ON_BROKER, KafkaCluster
from tributary.log.kafka.options import OFFSETS_TOPIC
from tributary.log.kafka.read import kafka_positions

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
