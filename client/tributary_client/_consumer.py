"""The consumer-group member over HTTP: joining, heartbeats, rebalances, pulls, streams and commits."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, Self

import httpx
import orjson

from tributary_client._types import (
    CommitFailedError,
    ConsumerError,
    OffsetOutOfRangeError,
    OffsetReset,
    Outcome,
    Record,
    TopicPartition,
)
from tributary_client._wire import error_code, message, raise_for, segment, sse_events

__all__ = ["Consumer"]


class Consumer:
    """A member of consumer group `group` reading `topics` from the server at `url`.

    Iterate it for records (it blocks while there are none), or call `poll()` for a batch.
    `commit()` commits every record handed out so far; `nack()` has a record delivered again later
    (parked after `max_retries` nacks), `park()` sets it aside; `close()` (or leaving the `with`
    block) leaves the group so its partitions move to the other members at once."""

    def __init__(
        self,
        url: str,
        *,
        group: str,
        topics: list[str] | tuple[str, ...],
        api_key: str | None = None,
        auto_offset_reset: OffsetReset = "latest",
        session_timeout_ms: int | None = None,
        max_retries: int | None = None,
        retry_backoff_ms: int | None = None,
        max_records: int = 500,
        max_bytes: int = 1_048_576,
        wait_ms: int = 5_000,
        timeout_s: float = 30.0,
    ) -> None:
        if not topics:
            raise ConsumerError("a consumer needs at least one topic")
        self.group = group
        self.topics = tuple(topics)
        self.auto_offset_reset = auto_offset_reset
        self.session_timeout_ms = session_timeout_ms
        self.max_retries, self.retry_backoff_ms = max_retries, retry_backoff_ms
        self.max_records, self.max_bytes, self.wait_ms = max_records, max_bytes, wait_ms
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Long polls hold a connection for up to wait_ms: the read timeout allows for it.
        timeout = httpx.Timeout(timeout_s, read=timeout_s + wait_ms / 1000)
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)
        self._beat_http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)
        self._lock = threading.Lock()
        self._member_id: str | None = None
        self._generation = -1
        self._assignment: frozenset[TopicPartition] = frozenset()
        self._rejoin = True
        self._pending: tuple[int, list[dict[str, Any]]] | None = None  # a newer generation a heartbeat brought
        self._heartbeat_ms = 3_000
        self._buffer: deque[Record] = deque()
        self._positions: dict[TopicPartition, int] = {}  # next offset per partition, of what was handed out
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self._closed = False

    # -- the public surface -------------------------------------------------------------------

    @property
    def member_id(self) -> str | None:
        return self._member_id

    @property
    def generation(self) -> int:
        return self._generation

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this member owns now (joining first if needed)."""
        self._ensure_joined()
        return self._assignment

    def __iter__(self) -> Iterator[Record]:
        while not self._closed:
            if not self._buffer:
                self._fetch()
            while self._buffer:
                if self._pending is not None:  # a rebalance the heartbeat saw: drop what moved away now
                    self._ensure_joined()
                    if not self._buffer:
                        break
                record = self._buffer.popleft()
                tp = (record.topic, record.partition)
                if tp not in self._assignment:
                    continue  # its partition moved away at a rebalance: its new owner reads it
                self._positions[TopicPartition(*tp)] = record.offset + 1
                yield record

    def stream(self) -> Iterator[Record]:
        """The member's records pushed by the server (`GET …/stream`, server-sent events) as they are
        committed to the log; blocks while there are none. Rebalances arrive in the stream and are
        taken at once. A dropped connection (a server restart, a network error) is resumed with
        `Last-Event-ID`, and records already handed out are not handed out again; after `timeout_s`
        without reaching the server it raises ConsumerError. Commit with `commit()` as when iterating."""
        last_id: str | None = None
        failing_since: float | None = None
        while not self._closed:
            self._ensure_joined()
            headers = {"Last-Event-ID": last_id} if last_id else {}
            timeout = httpx.Timeout(self._http.timeout.connect, read=max(self._http.timeout.read or 0, 45.0))
            try:
                with self._http.stream(
                    "GET",
                    self._member_path("stream"),
                    params={"generation": self._generation},
                    headers=headers,
                    timeout=timeout,
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        if response.status_code == 409:
                            self._after_fenced(response)
                            continue
                        if response.status_code == 410:
                            raise OffsetOutOfRangeError(message(response))
                        raise_for(response, "stream")
                    failing_since = None
                    for event, event_id, data in sse_events(response.iter_lines()):
                        if event == "record":
                            record = Record.from_json(orjson.loads(data))
                            tp = TopicPartition(record.topic, record.partition)
                            if tp not in self._assignment or record.offset < self._positions.get(tp, 0):
                                continue  # moved away, or handed out before a reconnect
                            self._positions[tp] = record.offset + 1
                            last_id = event_id or last_id
                            yield record
                        elif event == "rebalance" and self._member_id is not None:
                            body = orjson.loads(data)
                            self._apply(self._member_id, body["generation"], body.get("assignments", []))
                        elif event == "error":
                            body = orjson.loads(data)
                            if body.get("code") == "offset_out_of_range":
                                raise OffsetOutOfRangeError(str(body.get("detail") or body))
                            self._mark_rejoin()  # the member is gone (left, or silent past its session timeout)
                            break
            except httpx.TransportError as exc:
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > (self._http.timeout.connect or 30.0):
                    raise ConsumerError(f"stream failed: {exc or type(exc).__name__}") from None
                time.sleep(0.2)

    def poll(self, timeout_ms: int | None = None) -> list[Record]:
        """The records available now (waiting up to `timeout_ms` for the first), marked handed out."""
        if not self._buffer:
            self._fetch(self.wait_ms if timeout_ms is None else timeout_ms)
        if self._pending is not None:
            self._ensure_joined()
        assigned = self._assignment
        out = [r for r in self._buffer if (r.topic, r.partition) in assigned]
        self._buffer.clear()
        last: dict[tuple[str, int], int] = {}
        for record in out:
            last[record.topic, record.partition] = record.offset
        for (topic, partition), offset in last.items():
            self._positions[TopicPartition(topic, partition)] = offset + 1
        return out

    def position(self) -> dict[TopicPartition, int]:
        """The next offset per partition after what was handed out (what `commit()` would commit)."""
        return {tp: o for tp, o in self._positions.items() if tp in self._assignment}

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
        """Commit `offsets` (next offset to read per partition; default: everything handed out).
        Raises CommitFailedError when the group rebalanced meanwhile (the member rejoins on its
        next fetch); returns what was committed."""
        self._ensure_joined()
        chosen = dict(self.position() if offsets is None else offsets)
        if not chosen:
            return {}
        body = {
            "generation": self._generation,
            "offsets": [
                {"topic": tp.topic, "partition": tp.partition, "offset": o} for tp, o in sorted(chosen.items())
            ],
        }
        response = self._http.post(self._member_path("commit"), json=body)
        if response.status_code == 409:
            self._after_fenced(response)
            raise CommitFailedError(f"commit refused, the group rebalanced: {message(response)}")
        raise_for(response, "commit")
        return chosen

    def nack(self, records: Iterable[Record], *, reason: str | None = None) -> list[Outcome]:
        """Say these records could not be processed now: the server delivers each again after a
        backoff (its partition goes back to it, the records after it follow again), or parks it once
        it was nacked more than the member's `max_retries`. Records of this member's pulls only
        (`stream()` does not go back for them). Raises CommitFailedError when the group rebalanced."""
        return self._say_no("nack", records, reason)

    def park(self, records: Iterable[Record], *, reason: str) -> list[Outcome]:
        """Set these records aside in the group's parked records with `reason`; their partitions
        move on (commit past them as usual). An operator lists and replays them
        (`tributary groups parked GROUP`, `replay-parked`)."""
        return self._say_no("park", records, reason)

    def close(self) -> None:
        """Leave the group (its partitions move to the other members at once) and close the
        connections. Uncommitted records will be delivered again."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        try:
            if self._member_id is not None:
                self._http.delete(f"/groups/{segment(self.group)}/members/{segment(self._member_id)}")
        except httpx.TransportError:
            pass  # the server is gone: the session timeout removes the member
        finally:
            self._http.close()
            self._beat_http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- the group protocol ---------------------------------------------------------------------

    def _say_no(self, action: str, records: Iterable[Record], reason: str | None) -> list[Outcome]:
        refs = sorted({(r.topic, r.partition, r.offset) for r in records})
        if not refs:
            return []
        self._ensure_joined()
        body: dict[str, Any] = {
            "generation": self._generation,
            "records": [{"topic": t, "partition": p, "offset": o} for t, p, o in refs],
        }
        if reason is not None:
            body["reason"] = reason
        response = self._http.post(self._member_path(action), json=body)
        if response.status_code == 409:
            self._after_fenced(response)
            raise CommitFailedError(f"{action} refused, the group rebalanced: {message(response)}")
        raise_for(response, action)
        outcomes = [Outcome.from_json(o) for o in orjson.loads(response.content)["records"]]
        firsts: dict[tuple[str, int], int] = {}
        for o in outcomes:
            if o.action == "retry":
                tp = (o.topic, o.partition)
                firsts[tp] = min(firsts.get(tp, o.offset), o.offset)
        self._rewind(firsts)
        return outcomes

    def _rewind(self, firsts: Mapping[tuple[str, int], int]) -> None:
        """Partitions whose delivery went back to a nacked record: what this member holds of them from
        that offset on is delivered again after it, and is not handed out (or committed) before."""
        if not firsts:
            return
        self._buffer = deque(
            r for r in self._buffer if (r.topic, r.partition) not in firsts or r.offset < firsts[r.topic, r.partition]
        )
        for (topic, partition), offset in firsts.items():
            tp = TopicPartition(topic, partition)
            if tp in self._positions:
                self._positions[tp] = min(self._positions[tp], offset)

    def _member_path(self, tail: str) -> str:
        assert self._member_id is not None
        return f"/groups/{segment(self.group)}/members/{segment(self._member_id)}/{tail}"

    def _mark_rejoin(self) -> None:
        with self._lock:
            self._rejoin = True

    def _ensure_joined(self) -> None:
        if self._closed:
            raise ConsumerError("the consumer is closed")
        with self._lock:
            pending, self._pending = self._pending, None
        if not self._rejoin:
            if pending is not None and self._member_id is not None:
                # Take the new generation as the heartbeat gave it: partitions that stay keep their
                # delivery position on the server (a join would restart them at the committed offset).
                self._apply(self._member_id, pending[0], pending[1])
            return
        body: dict[str, Any] = {"topics": list(self.topics), "auto_offset_reset": self.auto_offset_reset}
        if self._member_id is not None:
            body["member_id"] = self._member_id
        for name in ("session_timeout_ms", "max_retries", "retry_backoff_ms"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        response = self._http.post(f"/groups/{segment(self.group)}/members", json=body)
        if response.status_code == 409 and "member_id" in body:  # our old id is gone: join as a new member
            del body["member_id"]
            response = self._http.post(f"/groups/{segment(self.group)}/members", json=body)
        raise_for(response, "join")
        joined = response.json()
        self._apply(joined["member_id"], joined["generation"], joined["assignments"])
        self._heartbeat_ms = int(joined.get("heartbeat_interval_ms") or self._heartbeat_ms)
        if self._beat is None:
            self._beat = threading.Thread(
                target=self._heartbeats, name=f"tributary-heartbeat-{self.group}", daemon=True
            )
            self._beat.start()

    def _apply(self, member_id: str, generation: int, assignments: list[dict[str, Any]]) -> None:
        assigned = frozenset(TopicPartition(a["topic"], int(a["partition"])) for a in assignments)
        with self._lock:
            self._member_id, self._generation, self._assignment = member_id, int(generation), assigned
            self._rejoin, self._pending = False, None
        # What was handed out of a partition that moved is its new owner's to commit (or redeliver).
        self._positions = {tp: o for tp, o in self._positions.items() if tp in assigned}
        self._buffer = deque(r for r in self._buffer if (r.topic, r.partition) in assigned)

    def _fetch(self, wait_ms: int | None = None) -> None:
        for _ in range(3):
            self._ensure_joined()
            params = {
                "generation": self._generation,
                "max_records": self.max_records,
                "max_bytes": self.max_bytes,
                "wait_ms": self.wait_ms if wait_ms is None else wait_ms,
            }
            try:
                response = self._http.get(self._member_path("records"), params=params)
            except httpx.TransportError:
                # The server may have handed out records whose answer never arrived: joining again
                # restarts delivery at the committed offsets, so nothing is skipped.
                self._mark_rejoin()
                raise
            if response.status_code == 409:
                self._after_fenced(response)
                continue
            if response.status_code == 410:
                raise OffsetOutOfRangeError(message(response))
            raise_for(response, "fetch")
            body = orjson.loads(response.content)  # several times faster than the json module on big batches
            if int(body.get("generation", self._generation)) != self._generation:
                self._mark_rejoin()
            self._buffer.extend(Record.from_json(r) for r in body["records"])
            return

    def _after_fenced(self, response: httpx.Response) -> None:
        """A 409 on a fetch: a fenced member takes the new generation from a heartbeat; an unknown
        one (left, or silent past its session timeout) joins again."""
        code = error_code(response)
        if code == "fenced" and self._member_id is not None:
            beat = self._http.post(
                f"/groups/{segment(self.group)}/members/{segment(self._member_id)}/heartbeat",
                json={"generation": self._generation},
            )
            if beat.status_code == 200:
                body = beat.json()
                self._apply(self._member_id, body["generation"], body.get("assignments", []))
                return
        self._mark_rejoin()

    def _heartbeats(self) -> None:
        """The heartbeat thread: keeps the membership alive while the caller works on records, and
        notices a rebalance (the caller's thread takes the new generation at its next fetch, so a
        batch is never cut under it)."""
        while not self._stop.wait(self._heartbeat_ms / 1000):
            with self._lock:
                member, generation, rejoin = self._member_id, self._generation, self._rejoin
            if member is None or rejoin:
                continue
            try:
                response = self._beat_http.post(
                    f"/groups/{segment(self.group)}/members/{segment(member)}/heartbeat",
                    json={"generation": generation},
                )
            except httpx.TransportError:
                continue  # the server may be restarting: the next beat or fetch says more
            if response.status_code == 409:
                self._mark_rejoin()
            elif response.status_code == 200:
                body = response.json()
                if body.get("rebalance") or int(body["generation"]) != generation:
                    with self._lock:
                        if self._generation == generation:
                            self._pending = (int(body["generation"]), list(body.get("assignments", [])))
