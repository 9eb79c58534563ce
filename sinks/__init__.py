"""Sinks: consumer groups that deliver the log elsewhere. The HTTP sink (`type = "http"` in
`[[sinks]]`) POSTs batches of records to a URL, at least once, in order per key, with retries,
exponential backoff and dead letters in the service database."""

from tributary.sinks.batching import Batch, Batcher
from tributary.sinks.config import HttpSinkConfig
from tributary.sinks.delivery import Answer, DeadLetter, Delivery, Outcome, Stopped
from tributary.sinks.member import GroupMember, to_record
from tributary.sinks.retry import Backoff, Verdict, classify, retry_after_ms
from tributary.sinks.runner import HttpSink, RecordSource
from tributary.sinks.store import DeadLetterRow, SinkError, SinkStatus, SinkStore

__all__ = [
    "Answer",
    "Backoff",
    "Batch",
    "Batcher",
    "DeadLetter",
    "DeadLetterRow",
    "Delivery",
    "GroupMember",
    "HttpSink",
    "HttpSinkConfig",
    "Outcome",
    "RecordSource",
    "SinkError",
    "SinkStatus",
    "SinkStore",
    "Stopped",
    "Verdict",
    "classify",
    "retry_after_ms",
    "to_record",
]
