"""What a failed step of a capture transaction on Kafka calls for (librdkafka's transactional
protocol): a fatal error a new producer, an abortable one an abort, a timeout the same call again."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from tributary.log.kafka.writer import _following, _Step

pytestmark = pytest.mark.unit

TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True)
ABORTABLE = KafkaError(KafkaError._STATE, "must abort", txn_requires_abort=True)
FATAL = KafkaError(KafkaError.INVALID_TXN_STATE, "invalid state", fatal=True)
PLAIN = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "not allowed")


@pytest.mark.parametrize("step", list(_Step))
def test_a_fatal_error_takes_a_new_producer_and_an_abortable_one_an_abort(step: _Step) -> None:
    assert _following(FATAL, step) is _Step.RENEW
    assert _following(ABORTABLE, step) is _Step.ABORT


@pytest.mark.parametrize("step", [_Step.RENEW, _Step.ABORT, _Step.COMMIT])
def test_a_call_that_timed_out_waiting_on_the_cluster_is_made_again(step: _Step) -> None:
    assert _following(TIMED_OUT, step) is step


def test_what_retrying_does_not_cure_stops_capture() -> None:
    assert _following(TIMED_OUT, _Step.BEGIN) is None  # begin and produce wait on nothing
    assert all(_following(PLAIN, step) is None for step in _Step)
