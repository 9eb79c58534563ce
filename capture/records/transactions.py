"""Transaction metadata (`transaction_metadata = true`): what a consumer needs to re-assemble a
source transaction from the records of many topics, as Debezium's `provide.transaction.metadata`.

Per source transaction that produced records: a BEGIN record, then its changes, each with a
`transaction` block `{id, total_order, data_collection_order}`, then an END record that counts
them per table, all on `<source>.transactions` (key `{"id": …}`) but for the changes themselves.
BEGIN is staged with the transaction's first change and END at its commit, so both are appended
in the same log commit as the changes: a crash never leaves one without the other. Pure.
"""

from __future__ import annotations

from typing import Any

import orjson

from tributary.capture.records.envelope import Output

__all__ = ["TransactionMonitor", "transactions_topic"]


def transactions_topic(source_name: str) -> str:
    """`<source>.transactions` (Debezium names it `<topic.prefix>.transaction`)."""
    return f"{source_name}.transactions"


class TransactionMonitor:
    """One source's transaction in progress: its id and the order and count of its events."""

    __slots__ = ("_counts", "_id", "_id_json", "_topic", "_ts_ms", "total")

    def __init__(self, source_name: str) -> None:
        self._topic = transactions_topic(source_name)
        self._id: str | None = None
        self._id_json = b"null"
        self._ts_ms: int | None = None
        self._counts: dict[str, int] = {}  # data collection → events so far, in first-seen order
        self.total = 0

    def begin(self, xid: int | None, lsn: int | None, ts_ms: int | None) -> None:
        """A source transaction starts: its id is Debezium's `<txId>:<lsn>` (both decimal)."""
        self._id = f"{xid}:{lsn}"
        self._id_json = orjson.dumps(self._id)
        self._ts_ms = ts_ms
        self._counts = {}
        self.total = 0

    def annotate(self, outputs: list[Output], data_collection: str) -> list[Output]:
        """A change's records with the `transaction` block spliced into each value (tombstones are
        no events), preceded by BEGIN when they are the transaction's first."""
        out = self.opening() if any(o.value is not None for o in outputs) else []
        for o in outputs:
            if o.value is not None:
                o.value = self.mark(o.value, data_collection)
            out.append(o)
        return out

    def opening(self) -> list[Output]:
        """BEGIN, when no event is counted yet: the caller's records are the transaction's first."""
        return [self._record("BEGIN", None, None)] if self.total == 0 else []

    def mark(self, value: bytes, data_collection: str) -> bytes:
        """One event's value (a JSON object) with its `transaction` block, counted."""
        self.total += 1
        n = self._counts[data_collection] = self._counts.get(data_collection, 0) + 1
        return b'%b,"transaction":{"id":%b,"total_order":%d,"data_collection_order":%d}}' % (
            value[:-1],
            self._id_json,
            self.total,
            n,
        )

    def end(self) -> list[Output]:
        """The transaction's END record with its counts, if it had events (else nothing, no BEGIN either)."""
        if self.total == 0:
            return []
        collections = [{"data_collection": name, "event_count": n} for name, n in self._counts.items()]
        return [self._record("END", self.total, collections)]

    def _record(self, status: str, count: int | None, collections: list[dict[str, Any]] | None) -> Output:
        key = orjson.dumps({"id": self._id})
        value = orjson.dumps(
            {
                "status": status,
                "id": self._id,
                "event_count": count,
                "data_collections": collections,
                "ts_ms": self._ts_ms,
            }
        )
        return Output(self._topic, key, value, timestamp_ms=self._ts_ms)
