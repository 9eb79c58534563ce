"""A consumer-group member as its own process, for the kill -9 tests:
`python -m tests.integration.consumers.member URL GROUP TOPIC OUT [COMMIT_EVERY]`.

Appends to OUT one JSON line per record it handles (`{"p", "o"}`) and one per successful commit
(`{"commit": {partition: next offset}}`), each flushed before the next step."""

from __future__ import annotations

import sys

import orjson

from tributary.client import CommitFailedError, Consumer


def main() -> None:
    url, group, topic, out = sys.argv[1:5]
    every = int(sys.argv[5]) if len(sys.argv) > 5 else 10
    with (
        open(out, "ab", buffering=0) as f,
        Consumer(
            url, group=group, topics=[topic], auto_offset_reset="earliest", session_timeout_ms=3000, wait_ms=500
        ) as consumer,
    ):
        handled = 0
        for record in consumer:
            f.write(orjson.dumps({"p": record.partition, "o": record.offset}) + b"\n")
            handled += 1
            if handled % every == 0:
                try:
                    done = consumer.commit()
                except CommitFailedError:
                    continue
                f.write(orjson.dumps({"commit": {str(tp.partition): o for tp, o in done.items()}}) + b"\n")


if __name__ == "__main__":
    main()
