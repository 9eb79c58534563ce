"""`tributary init` asks the configured log what its compaction keeps (`LogAdmin`): on Kafka the
broker compacts without reading records, so an unchanged TOASTed value that a later update omitted
can be lost, and init names the tables where that can happen; the local log fills such values in
while compacting, so it names none."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import cli, write_config
from tests.integration.kafka.helpers import write_kafka_config
from tests.kafka_fixtures import KafkaCluster

pytestmark = pytest.mark.integration

WARNING = 'compaction can leave an unchanged large value only as "__tributary_unavailable__" in public.doc'


def test_init_names_tables_whose_unchanged_values_only_kafka_can_lose(
    kafka: KafkaCluster, fresh_db: str, tmp_path: Path
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE doc (id int PRIMARY KEY, body text)")
    on_kafka = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn=fresh_db,
        log_root=tmp_path / "kstatus",
        bootstraps=kafka.bootstraps,
        create_topics=kafka.creates_topics,
    )
    local = write_config(tmp_path / "local.toml", dsn=fresh_db, log_root=tmp_path / "log", name="crm")
    kafka_run, local_run = cli("init", "--config", str(on_kafka)), cli("init", "--config", str(local))
    assert kafka_run.returncode == 0, kafka_run.stderr
    assert local_run.returncode == 0, local_run.stderr
    assert WARNING in kafka_run.stdout
    assert "compaction can leave" not in local_run.stdout
