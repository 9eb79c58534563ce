"""One HTTP sink's loop: a member of its consumer group that batches what it is given, POSTs the
batches in order, and commits after each batch is delivered or dead-lettered.

The commit protocol, in order (at-least-once, per-key order kept):

1. poll records of the member's partitions (offset order per partition) into the batcher;
2. when a batch is full or has lingered, deliver it (`Delivery`: retries, splitting, give-up);
3. store the records it gave up on as dead letters (idempotent per record);
4. commit, per partition, the offset after the batch's last record.

A crash anywhere before 4 delivers the batch again after the restart (the receiver may see a
record twice: it can drop duplicates by topic/partition/offset). A rebalance between 2 and 4 makes
the commit fail: the partition's new owner delivers those records again.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import httpx
import psycopg
from psycopg_pool import PoolTimeout
from tributary_client import CommitFailedError, ConsumerError, Record, TopicPartition

from tributary.sinks.batching import Batch, Batcher
from tributary.sinks.config import HttpSinkConfig
from tributary.sinks.delivery import Answer, Delivery, Stopped
from tributary.sinks.retry import Backoff, retry_after_ms
from tributary.sinks.store import SinkStore, encode

__all__ = ["HttpSink", "RecordSource"]

log = logging.getLogger(__name__)


class RecordSource(Protocol):
    """What the sink reads from: a consumer-group member (`tributary_client.Consumer` has this shape)."""

    def poll(self, timeout_ms: int | None = None) -> list[Record]: ...

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, int]: ...

    def close(self) -> None: ...


class HttpSink:
    """Runs `config`'s delivery loop over `source` until `stop()`; status and dead letters go to `store`."""

    def __init__(self, config: HttpSinkConfig, source: RecordSource, store: SinkStore) -> None:
        self.config = config
        self.source = source
        self.store = store
        self._stopping = threading.Event()
        self._http = httpx.Client(
            timeout=config.request_timeout_s,
            headers={"Content-Type": "application/json", **dict(config.headers)},
        )
        self._delivery: Delivery[tuple[Record, bytes]] = Delivery(
            send=self._post,
            sleep=self._sleep,
            backoff=Backoff(config.initial_backoff_ms, config.max_backoff_ms),
            max_attempts=config.max_attempts,
            rng=random.Random(),
        )
        self._batcher: Batcher[tuple[Record, bytes]] = Batcher(
            config.max_batch_records, config.max_batch_bytes, config.linger_ms
        )

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        """The loop; returns after `stop()` (the batch in hand is not committed, so it is sent again)."""
        name = self.config.name
        self.store.report(name, state="running")
        try:
            while not self._stopping.is_set():
                now = time.monotonic() * 1000
                wait = self._batcher.wait_ms(now, self.config.poll_wait_ms)
                records = self._poll(wait) if wait > 0 or not len(self._batcher) else []
                encoded = [((r, body), len(body) + 1) for r in records for body in (encode(r),)]
                ready = self._batcher.add(encoded, time.monotonic() * 1000)
                if self._batcher.due(time.monotonic() * 1000):
                    last = self._batcher.take()
                    if last is not None:
                        ready.append(last)
                for batch in ready:
                    self._send(batch)
        except Stopped:
            pass
        finally:
            self.store.report(name, state="stopped")
            self._http.close()

    def _poll(self, wait_ms: int) -> list[Record]:
        """The source's next records; when the group's server cannot be reached, say so in the status
        and try again after a pause (the batch in hand waits: nothing is committed meanwhile)."""
        failures = 0
        while True:
            try:
                return self.source.poll(timeout_ms=wait_ms)
            except (httpx.TransportError, ConsumerError, psycopg.OperationalError, PoolTimeout) as exc:
                failures += 1
                message = f"reading the group {self.config.group}: {exc}"
                log.warning("sink %s: %s", self.config.name, message)
                self.store.report(self.config.name, state="retrying", last_error=message)
                if not self._sleep(self._delivery.backoff.delay_ms(failures, self._delivery.rng)):
                    raise Stopped from None

    def _send(self, batch: Batch[tuple[Record, bytes]]) -> None:
        name = self.config.name
        outcome = self._delivery.deliver(batch.items)
        dead = 0
        last_error = None
        for letter in outcome.dead:
            records = [r for r, _ in letter.items]
            dead += self.store.dead_letter(name, records, letter.error, letter.attempts)
            last_error = letter.error
            log.warning(
                "sink %s: %d record(s) to the dead letters after %d attempt(s): %s",
                name,
                len(records),
                letter.attempts,
                letter.error,
            )
        self.store.report(
            name,
            state="running",
            delivered=outcome.delivered,
            requests=outcome.requests,
            failed_attempts=outcome.failed_attempts,
            dead_letters=dead,
            last_error=last_error,
            delivered_now=outcome.delivered > 0,
        )
        try:
            self.source.commit(_next_offsets(r for r, _ in batch.items))
        except CommitFailedError as exc:
            log.info("sink %s: %s", name, exc)  # the new owner of those partitions delivers them again
        except ConsumerError as exc:
            log.warning("sink %s: commit failed: %s", name, exc)

    def _post(self, items: Sequence[tuple[Record, bytes]]) -> Answer:
        body = b"[" + b",".join(b for _, b in items) + b"]"
        try:
            response = self._http.post(self.config.url, content=body)
        except httpx.HTTPError as exc:
            return Answer(None, f"POST {self.config.url}: {type(exc).__name__}: {exc}")
        if 200 <= response.status_code < 300:
            return Answer(response.status_code)
        text = response.text[:200].replace("\n", " ")
        return Answer(
            response.status_code,
            f"POST {self.config.url}: HTTP {response.status_code} {text}".rstrip(),
            retry_after_ms(response.headers.get("retry-after"), self.config.max_backoff_ms),
        )

    def _sleep(self, ms: float) -> bool:
        return not self._stopping.wait(ms / 1000)


def _next_offsets(records: Iterable[Record]) -> dict[TopicPartition, int]:
    out: dict[TopicPartition, int] = {}
    for r in records:
        tp = r.topic_partition
        out[tp] = max(out.get(tp, 0), r.offset + 1)
    return out
