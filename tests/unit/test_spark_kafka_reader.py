"""`[projections] kafka_reader`: the setting, and what the Spark reader hands Spark's Kafka source
(offset ranges, Java client settings) or tells a user whose set-up lacks the connector."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tributary.api.settings.config import ConfigError, load_settings
from tributary.log.kafka.options import KafkaOptions
from tributary.projections.runner import RunSettings
from tributary.projections.spark_kafka_source import java_client_options, missing_connector, offset_options

pytestmark = pytest.mark.unit


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tributary.toml"
    path.write_text(text)
    return path


def test_the_reader_comes_from_the_file_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _config(tmp_path, '[log]\nbackend = "kafka"\n\n[projections]\nkafka_reader = "spark"\n')
    assert RunSettings.from_settings(load_settings(path), dsn="postgresql://h/db").kafka_reader == "spark"
    monkeypatch.setenv("TRIBUTARY_PROJECTIONS__KAFKA_READER", "python")
    assert RunSettings.from_settings(load_settings(path), dsn="postgresql://h/db").kafka_reader == "python"


def test_an_unknown_reader_is_refused_in_one_line_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(_config(tmp_path, '[projections]\nkafka_reader = "java"\n'))
    assert "kafka_reader" in str(err.value) and "python" in str(err.value) and "spark" in str(err.value)
    assert len(str(err.value).strip().splitlines()) == 1


def test_offset_options_read_exactly_the_planned_ranges() -> None:
    got = offset_options({("b.t", 1): (5, 9), ("a.t", 0): (0, 3), ("b.t", 0): (2, 2)})
    assert json.loads(got["assign"]) == {"a.t": [0], "b.t": [0, 1]}
    assert json.loads(got["startingOffsets"]) == {"a.t": {"0": 0}, "b.t": {"0": 2, "1": 5}}
    assert json.loads(got["endingOffsets"]) == {"a.t": {"0": 3}, "b.t": {"0": 2, "1": 9}}


def test_security_settings_reach_the_java_client() -> None:
    options = KafkaOptions(
        bootstrap_servers="k1:9093,k2:9093",
        client={
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "app",
            "sasl.password": 'p"w\\d',
            "ssl.ca.location": "/etc/ca.pem",  # librdkafka's: Java reads a truststore instead
            "ssl.endpoint.identification.algorithm": "https",
            "log_level": "3",  # librdkafka's own
        },
    )
    assert java_client_options(options) == {
        "kafka.bootstrap.servers": "k1:9093,k2:9093",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.ssl.endpoint.identification.algorithm": "https",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required username="app" '
        'password="p\\"w\\\\d";',
    }


def test_plain_login_and_a_jaas_line_of_the_users_own() -> None:
    plain = java_client_options(KafkaOptions("k:9092", client={"sasl.username": "u", "sasl.password": "p"}))
    assert plain["kafka.sasl.jaas.config"].startswith("org.apache.kafka.common.security.plain.PlainLoginModule ")
    own = 'x.Login required token="t";'
    kept = java_client_options(
        KafkaOptions("k:9092", client={"sasl.username": "u", "sasl.password": "p", "sasl.jaas.config": own})
    )
    assert kept["kafka.sasl.jaas.config"] == own


def test_a_missing_connector_is_told_in_one_line(tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    said = missing_connector({}, lib)
    assert said is not None and "make setup" in said and "kafka_reader" in said and "\n" not in said
    assert missing_connector({"spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"}, lib) is None
    spark_jars = tmp_path / "spark" / "jars"  # a Spark installed with the connector among its jars
    spark_jars.mkdir(parents=True)
    assert missing_connector({}, lib, [spark_jars]) is not None
    (spark_jars / "spark-sql-kafka-0-10_2.13-4.3.0.jar").write_bytes(b"")
    assert missing_connector({}, lib, [spark_jars]) is None
    lib.mkdir()
    (lib / "spark-sql-kafka-0-10_2.13-4.2.0.jar").write_bytes(b"")
    assert missing_connector({}, lib) is None
