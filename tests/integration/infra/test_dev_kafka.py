"""The local Kafka as `tributary kafka up|status|down` runs it: Apache Kafka's own broker (KRaft),
outliving the command that started it, answering clients, stopped by `down`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tributary.api.devdb import free_port
from tributary.api.devkafka import BrokerError, EmbeddedKafka
from tributary.log.kafka.clients import with_logger

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from tributary.api.cli.main import main; main()", "kafka", *args],
        capture_output=True,
        text=True,
        timeout=400,
    )


def test_kafka_up_status_down(tmp_path: Path) -> None:
    data = str(tmp_path / "kafka")
    port = free_port()
    broker = EmbeddedKafka(Path(data))
    try:
        up = _cli("up", "--data-dir", data, "--port", str(port))
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == f"127.0.0.1:{port}"
        status = _cli("status", "--data-dir", data)  # another process than `up`'s, which has exited
        assert status.returncode == 0 and status.stdout.strip() == f"127.0.0.1:{port}", status.stderr
        admin = AdminClient(with_logger({"bootstrap.servers": up.stdout.strip()}))
        admin.create_topics([NewTopic("dev.public.t", 2, 1)])["dev.public.t"].result(60)
        again = _cli("up", "--data-dir", data)  # already running: the same address, nothing started
        assert again.returncode == 0 and again.stdout.strip() == f"127.0.0.1:{port}", again.stderr
        down = _cli("down", "--data-dir", data)
        assert down.returncode == 0 and down.stdout.strip() == "stopped", down.stderr
        assert not broker.is_running()
        stopped = _cli("status", "--data-dir", data)
        assert stopped.returncode == 1
        assert stopped.stderr.strip().splitlines() == [
            f"tributary: the local Kafka in {data} is not running: run `tributary kafka up`"
        ]
        restarted = _cli("up", "--data-dir", data)  # the topics stay
        assert restarted.returncode == 0, restarted.stderr
        topics = AdminClient(with_logger({"bootstrap.servers": restarted.stdout.strip()})).list_topics(timeout=30)
        assert len(topics.topics["dev.public.t"].partitions) == 2
    finally:
        if (Path(data) / "tributary-kafka.json").exists():
            broker.down(timeout=30)


def test_kafka_up_without_the_jars_is_one_line(tmp_path: Path) -> None:
    broker = EmbeddedKafka(tmp_path / "kafka", lib_dir=tmp_path / "nowhere")
    with pytest.raises(BrokerError, match=r"Apache Kafka's jars are not in .*nowhere: run `make setup`$"):
        broker.up(port=free_port())


def test_a_cluster_id_never_starts_with_a_dash() -> None:
    """`kafka-storage format -t -…` reads such an id as an option and fails: one in 64 starts."""
    from tributary.api.devkafka.embedded import _cluster_id

    draws = iter([b"\xfb" + bytes(15), bytes(16)])  # the first encodes to "-w…"
    assert _cluster_id(lambda: next(draws)) == "A" * 22
