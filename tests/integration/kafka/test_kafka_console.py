"""The operator's view on the Kafka backend: `GET /topics` (the console's Topics table) and the
log's gauges in `/metrics` show the cluster's topics, not an empty local log."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import psycopg
import pytest

from tests import waiting
from tests.integration.capture.helpers import cli
from tests.integration.kafka.helpers import write_kafka_config
from tests.kafka_fixtures import KafkaCluster
from tests.servers import free_port, serving
from tributary.eventstore.migrate import run_migrations
from tributary.log.kafka.writer import OFFSETS_TOPIC

pytestmark = pytest.mark.integration

TOPIC = "shop.public.items"


def test_topics_and_metrics_show_the_kafka_topics(fresh_db: str, tmp_path: Path, kafka: KafkaCluster) -> None:
    kafka.prepare(TOPIC)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 12) g")
    run_migrations(fresh_db)
    port = free_port()
    config = write_kafka_config(
        tmp_path / "kafka.toml",
        dsn=fresh_db,
        log_root=tmp_path / "kstatus",
        bootstraps=kafka.bootstraps,
        create_topics=kafka.creates_topics,
    )
    config.write_text(config.read_text() + f'\n[service]\ndsn = "{fresh_db}"\n\n[api]\nport = {port}\n')
    done = cli("capture", "--config", str(config), "--until-idle", "1")
    assert done.returncode == 0, done.stderr

    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        r = httpx.get(f"{base}/topics", timeout=30)
        assert r.status_code == 200, r.text
        rows = {t["topic"]: t for t in r.json()}
        assert OFFSETS_TOPIC not in rows  # internal topics are not the user's
        items = rows[TOPIC]
        assert items["partitions"] == 3 and items["policy"] == "broker"
        assert len(items["start_offsets"]) == len(items["end_offsets"]) == 3
        # 12 snapshot rows and a schema record, plus one commit marker per partition written
        assert 13 <= items["records"] == sum(items["end_offsets"]) - sum(items["start_offsets"])

        pattern = re.compile(rf'^tributary_log_records\{{topic="{re.escape(TOPIC)}"\}} (\S+)$', re.M)
        found: list[re.Match[str] | None] = []

        def shown() -> bool:  # the gauges are refreshed in the background
            found.append(pattern.search(httpx.get(f"{base}/metrics", timeout=30).text))
            return found[-1] is not None

        waiting.wait_progress(shown, lambda: None, what="tributary_log_records for the Kafka topic", poll=0.5)
        assert (last := found[-1]) is not None and float(last.group(1)) == items["records"]
