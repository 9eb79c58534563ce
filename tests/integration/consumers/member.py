"""A consumer-group member as its own process, for the kill -9 tests:
`python -m tests.integration.consumers.member URL GROUP TOPIC OUT [COMMIT_EVERY]`
(commits after each batch once COMMIT_EVERY records were handled since the last commit).

Appends to OUT its member id (`{"member"}`) once joined, then one JSON line per record it handles (`{"p", "o", "t"}`: partition, offset, wall time) and one per successful commit
(`{"commit": {partition: next offset}}`), each flushed before the next step. SIGTERM: it leaves
the group after the step in hand (so its log of commits is complete); SIGKILL: it vanishes."""

from __future__ import annotations

import signal
import sys
import time

import orjson
from tributary_client import CommitFailedError, Consumer


def main() -> None:
    url, group, topic, out = sys.argv[1:5]
    every = int(sys.argv[5]) if len(sys.argv) > 5 else 10
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))  # finish the step, then leave the group
    with (
        open(out, "ab", buffering=0) as f,
        Consumer(
            url, group=group, topics=[topic], auto_offset_reset="earliest", session_timeout_ms=3000, wait_ms=500
        ) as consumer,
    ):
        handled = 0

        def commit() -> None:
            try:
                done = consumer.commit()
            except CommitFailedError:
                return
            f.write(orjson.dumps({"commit": {str(tp.partition): o for tp, o in done.items()}}) + b"\n")

        consumer.assignment()  # joins
        f.write(orjson.dumps({"member": consumer.member_id}) + b"\n")
        while not stopping:
            records = consumer.poll(500)
            for record in records:
                f.write(orjson.dumps({"p": record.partition, "o": record.offset, "t": time.time()}) + b"\n")
            handled += len(records)
            if handled >= every:  # commit() covers the whole batch poll() handed out: commit after it
                commit()
                handled = 0
        commit()


if __name__ == "__main__":
    main()
