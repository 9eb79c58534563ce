"""Writer process for the crash test: appends and commits forever, printing each committed end.

Prints `intent <json ends>` before each commit and `committed <json ends>` after it (flushed), so
the parent knows the committed prefix is at least the last `committed` and at most the
last `intent`.
Values are derived from (partition, offset) so the parent can check every byte after recovery.
"""

from __future__ import annotations

import json
import random
import sys
from concurrent.futures import Future
from pathlib import Path

from tributary.log.local import Log, TopicConfig, canonical_json

PARTS = 3


def value(p: int, off: int) -> bytes:
    return canonical_json({"p": p, "o": off, "pad": "x" * ((off * 7 + p) % 300)})


def main() -> None:
    root = Path(sys.argv[1])
    rnd = random.Random(int(sys.argv[2]))
    log = Log.open(root, writer=True, segment_bytes=16_384, index_interval_bytes=512)
    log.create_topic("t", TopicConfig(partitions=PARTS))
    n = 0
    inflight: tuple[Future[None], list[int], int] | None = None

    def report(ends: list[int], n: int) -> None:
        print("committed", json.dumps(ends, separators=(",", ":")), n, flush=True)

    while True:
        for _ in range(rnd.randint(1, 4)):
            p = rnd.randrange(PARTS)
            start = log.mark().ends[("t", p)].end
            batch = [
                (canonical_json({"id": start + i}), value(p, start + i), start + i, None)
                for i in range(rnd.randint(1, 200))
            ]
            assert log.append("t", p, batch) == start
        n += 1
        ends = [log.mark().ends[("t", p)].end for p in range(PARTS)]
        if inflight is not None:  # one pipelined commit in flight at most
            inflight[0].result()
            report(inflight[1], inflight[2])
            inflight = None
        print("intent", json.dumps(ends, separators=(",", ":")), flush=True)
        if n % 2:
            log.commit(positions={"src": str(n)})
            report(ends, n)
        else:  # pipelined: the next appends run while this commit fsyncs
            inflight = (log.commit_async(positions={"src": str(n)}), ends, n)


if __name__ == "__main__":
    main()
