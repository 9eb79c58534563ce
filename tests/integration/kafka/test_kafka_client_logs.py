"""librdkafka's own log lines (a broker it cannot reach: `FAIL|rdkafka#consumer-1| … Connection
refused`) reach Python logging under `tributary.kafka.librdkafka`, never the process's raw stderr:
a user's log keeps one format, and a test's lines stay in that test's log."""

from __future__ import annotations

import logging

import pytest

from tests.waiting import wait_progress
from tributary.log.kafka.clients import LIBRDKAFKA_LOGGER, consumer_config
from tributary.log.kafka.options import KafkaOptions
from tributary.log.kafka.read import committed_reader
from tributary.projections.kafka_source import _consumer_config

pytestmark = pytest.mark.integration

UNREACHABLE = KafkaOptions(bootstrap_servers="127.0.0.1:1")


def _fail_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LIBRDKAFKA_LOGGER and "FAIL" in r.getMessage()]


@pytest.mark.parametrize("make", ["committed_reader", "group", "projection"])
def test_a_refused_connection_is_a_log_record_not_a_stderr_line(
    make: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    from confluent_kafka import Consumer

    caplog.set_level(logging.DEBUG, logger=LIBRDKAFKA_LOGGER)
    if make == "committed_reader":
        consumer = committed_reader(UNREACHABLE)
    elif make == "group":  # the consumer groups' offsets
        consumer = Consumer(consumer_config(UNREACHABLE, group="g"))
    else:
        consumer = Consumer(_consumer_config(UNREACHABLE, "projection"))
    try:

        def failed() -> bool:
            consumer.poll(0.2)  # the client hands its log lines over while polled
            return bool(_fail_records(caplog))

        wait_progress(failed, lambda: len(caplog.records), what="librdkafka's FAIL line", stall=30)
    finally:
        consumer.close()
    assert "127.0.0.1:1" in _fail_records(caplog)[0].getMessage()
    err = capfd.readouterr().err
    assert "FAIL" not in err and "rdkafka#" not in err, err
