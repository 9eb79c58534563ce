"""How the log's records and Kafka's messages map onto each other: headers both ways, a consumed
message as a `Record`, a client error as one line. No Kafka client import: capture, the CLI, the
consumer groups' server and the projections' Spark tasks share it."""

from __future__ import annotations

import orjson
from confluent_kafka import Message

from tributary.log.local import Record

__all__ = ["NO_KEY", "WHOLE_HEADERS", "as_record", "kafka_headers", "kafka_key", "log_headers", "log_key", "one_line"]

# The one Kafka header that carries log headers which were not a JSON object, whole.
WHOLE_HEADERS = "tributary.headers"
# A record the log writes without a key (a truncate, on every partition) carries this empty key on
# Kafka: a compacted topic refuses a record with none. No log key is empty (keys are JSON).
NO_KEY = b""


def kafka_key(key: bytes | None) -> bytes:
    """The log's key as a Kafka message key: no key becomes `NO_KEY`."""
    return NO_KEY if key is None else key


def log_key(key: bytes | None) -> bytes | None:
    """A Kafka message key back as the log's: the inverse of `kafka_key` (`NO_KEY` or none → None)."""
    return key or None


KafkaHeaders = dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]]
"""A Kafka message's headers as the client hands them over (`Message.headers()`)."""


def kafka_headers(headers: bytes | None) -> list[tuple[str, bytes]] | None:
    """The log's headers (a JSON object of strings) as Kafka headers."""
    if headers is None:
        return None
    try:
        parsed = orjson.loads(headers)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        return [(str(k), v.encode() if isinstance(v, str) else orjson.dumps(v)) for k, v in parsed.items()]
    return [(WHOLE_HEADERS, headers)]


def log_headers(headers: KafkaHeaders | None) -> bytes | None:
    """Kafka headers (a list of pairs, or a dict) back as the log's: the inverse of `kafka_headers`."""
    if not headers:
        return None
    pairs = list(headers.items() if isinstance(headers, dict) else headers)
    if len(pairs) == 1 and pairs[0][0] == WHOLE_HEADERS and (whole := pairs[0][1]) is not None:
        return whole if isinstance(whole, bytes) else whole.encode()  # a consumer's values are bytes
    return orjson.dumps({k: (v.decode(errors="replace") if isinstance(v, bytes) else v) for k, v in pairs})


def as_record(topic: str, msg: Message) -> Record:
    """A consumed Kafka message (not an error event) as the log's `Record`."""
    partition, offset = msg.partition(), msg.offset()
    assert partition is not None and offset is not None  # a record read has both
    return Record(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp=msg.timestamp()[1],
        key=log_key(msg.key()),
        value=msg.value(),
        headers=log_headers(msg.headers()),
    )


def one_line(exc: BaseException) -> str:
    """A Kafka client error's first non-empty line (librdkafka's can span several)."""
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
