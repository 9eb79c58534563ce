"""`[log] backend` and `[log.kafka]`: from TOML and the environment into capture's Kafka options,
client settings never shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tributary.api.settings.config import ConfigError, load_settings
from tributary.api.settings.log import kafka_options
from tributary.api.settings.masking import MASK, masked
from tributary.api.settings.sources import OUTBOX_SOURCE, source_specs

pytestmark = pytest.mark.unit


def test_kafka_table_from_toml_becomes_capture_options(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(
        '[log]\nbackend = "kafka"\n\n[log.kafka]\nbootstrap_servers = "b1:9092,b2:9092"\npartitions = 6\n'
        'create_topics = false\nclient = { "security.protocol" = "SASL_SSL", "sasl.password" = "hunter2" }\n'
    )
    settings = load_settings(path)
    options = kafka_options(settings)
    assert options is not None
    assert (options.bootstrap_servers, options.partitions, options.create_topics) == ("b1:9092,b2:9092", 6, False)
    assert options.client == {"security.protocol": "SASL_SSL", "sasl.password": "hunter2"}
    shown = masked(settings)["log"]["kafka"]
    assert shown["client"] == {"security.protocol": MASK, "sasl.password": MASK}
    assert "hunter2" not in json.dumps(masked(settings))


def test_local_backend_has_no_kafka_options(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[log.kafka]\nbootstrap_servers = "b1:9092"\n')
    assert kafka_options(load_settings(path)) is None


def test_environment_sets_a_key_of_the_sub_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {
        "TRIBUTARY_LOG__BACKEND": "kafka",
        "TRIBUTARY_LOG__KAFKA__BOOTSTRAP_SERVERS": "k:9092",
        "TRIBUTARY_LOG__KAFKA__CLIENT": '{"sasl.username": "u"}',
        "TRIBUTARY_LOG__KAFKA__REPLICATION_FACTOR": "1",
    }
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    options = kafka_options(load_settings(_empty(tmp_path)))
    assert options is not None
    assert (options.bootstrap_servers, options.client, options.replication_factor) == (
        "k:9092",
        {"sasl.username": "u"},
        1,
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TRIBUTARY_LOG__BACKEND", "s3", "backend"),
        ("TRIBUTARY_LOG__KAFKA__PARTITIONS", "0", "partitions"),
        ("TRIBUTARY_LOG__KAFKA__NOPE", "1", "unknown setting TRIBUTARY_LOG__KAFKA__NOPE"),
    ],
)
def test_bad_kafka_settings_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        load_settings(_empty(tmp_path))


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.toml"
    path.write_text("")
    return path


@pytest.mark.parametrize(
    ("backend", "expected"),
    [("kafka", {"shop": 2, "crm": 6, OUTBOX_SOURCE: 6}), ("local", {"shop": 2, "crm": 3, OUTBOX_SOURCE: 3})],
)
def test_a_sources_partitions_win_then_the_backends_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, expected: dict[str, int]
) -> None:
    """Topics a source creates get its `[[sources]] partitions`, else the backend's default:
    `[log.kafka] partitions` on Kafka (as a Debezium connector's topic-creation settings override
    the broker's), `[log] partitions` on the local log."""
    monkeypatch.setenv("TRIBUTARY_SERVICE__DSN", "postgresql://u@127.0.0.1/service")
    path = tmp_path / "t.toml"
    path.write_text(
        f'[log]\nbackend = "{backend}"\npartitions = 3\n\n[log.kafka]\nbootstrap_servers = "b:9092"\npartitions = 6\n\n'
        '[[sources]]\nname = "shop"\ndsn = "postgresql://u@127.0.0.1/shop"\npartitions = 2\n\n'
        '[[sources]]\nname = "crm"\ndsn = "postgresql://u@127.0.0.1/crm"\n'
    )
    specs = source_specs(load_settings(path), with_outbox=True)
    assert {s.name: s.partitions for s in specs} == expected
