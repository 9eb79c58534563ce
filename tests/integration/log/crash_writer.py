"""Writer process for the crash test: appends and commits forever, printing each committed end.

Prints `intent <json ends>` before each commit and `committed <json ends>` after it (flushed), so
the parent knows the committed prefix is at least the last `committed` and at most the
last `intent`.
Values are derived from (partition, offset) so the parent can check every byte after recovery.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from concurrent.futures import Future
from pathlib import Path

from tributary.log.local import Log, TopicConfig, canonical_json

PARTS = 3
REPO = Path(__file__).resolve().parents[3]


def value(p: int, off: int) -> bytes:
    return canonical_json({"p": p, "o": off, "pad": "x" * ((off * 7 + p) % 300)})


def spawn(root: Path, seed: int, owner: str | None = None, topic: str = "t") -> subprocess.Popen[bytes]:
    """Start this writer on `root` (as `owner`'s writer of `topic`, the default owner's "t" if not given)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [str(root), str(seed)] + ([owner, topic] if owner else [])
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve())] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )


def kill(proc: subprocess.Popen[bytes]) -> tuple[list[int], list[int], int]:
    """kill -9 the writer; its last committed ends, last intended ends and commit count."""
    proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate()  # (killed: its pipes end at once)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    committed, intent, n = [0] * PARTS, [0] * PARTS, 0
    for line in out.decode().splitlines():
        parts = line.split(" ")
        try:
            if parts[0] == "committed" and len(parts) == 3:
                committed, n = json.loads(parts[1]), int(parts[2])
            elif parts[0] == "intent" and len(parts) == 2:
                intent = json.loads(parts[1])
        except ValueError:  # the last line, torn by the kill
            continue
    return committed, intent, n


def main() -> None:
    root = Path(sys.argv[1])
    rnd = random.Random(int(sys.argv[2]))
    owner, topic = (sys.argv[3], sys.argv[4]) if len(sys.argv) > 4 else (None, "t")
    log = Log.open(root, writer=True, segment_bytes=16_384, index_interval_bytes=512, owner=owner)
    log.create_topic(topic, TopicConfig(partitions=PARTS))
    n = 0
    inflight: tuple[Future[None], list[int], int] | None = None

    def report(ends: list[int], n: int) -> None:
        print("committed", json.dumps(ends, separators=(",", ":")), n, flush=True)

    while True:
        for _ in range(rnd.randint(1, 4)):
            p = rnd.randrange(PARTS)
            start = log.mark().ends[(topic, p)].end
            batch = [
                (canonical_json({"id": start + i}), value(p, start + i), start + i, None)
                for i in range(rnd.randint(1, 200))
            ]
            assert log.append(topic, p, batch) == start
        n += 1
        ends = [log.mark().ends[(topic, p)].end for p in range(PARTS)]
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
