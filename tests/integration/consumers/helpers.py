"""Helpers for the consumer-side tests: a log filled with keyed records, a config that serves it,
and a real HTTP receiver on loopback that fails requests by plan."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tributary.api.devdb.embedded import free_port
from tributary.log.local import Log, TopicConfig, canonical_json

__all__ = ["Filler", "Receiver", "receiving", "write_config"]


class Filler:
    """Writes records `{"n": i, "key": k}` keyed by `k`, committed per call."""

    def __init__(self, root: Path) -> None:
        self.log = Log.open(root, writer=True, segment_bytes=65536)

    def topic(self, name: str, partitions: int = 3) -> None:
        if name not in self.log.topics():
            self.log.create_topic(name, TopicConfig(partitions=partitions))

    def write(self, topic: str, items: list[tuple[str, dict[str, Any]]], ts_ms: int = 1_700_000_000_000) -> None:
        by_partition: dict[int, list[tuple[bytes, bytes, int, None]]] = {}
        for key, value in items:
            k = canonical_json(key)
            by_partition.setdefault(self.log.partition_for(topic, k), []).append((k, orjson.dumps(value), ts_ms, None))
        for partition, records in by_partition.items():
            self.log.append(topic, partition, records)
        self.log.commit()

    def close(self) -> None:
        self.log.close()


def write_config(path: Path, *, dsn: str, log_root: Path, port: int, extra: str = "") -> Path:
    path.write_text(
        f"""
[service]
dsn = "{dsn}"

[log]
root = "{log_root}"

[api]
port = {port}
status_refresh_s = 1.0
{extra}
"""
    )
    return path


@dataclass
class Receiver:
    """What the receiver got: every request's records (JSON arrays), answered by `plan(request
    number, records) → status` (200 unless the plan says otherwise)."""

    plan: Callable[[int, list[Any]], int] = lambda n, records: 200
    accepted: list[list[Any]] = field(default_factory=list)
    refused: list[tuple[int, int]] = field(default_factory=list)  # (request number, status)
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def records(self) -> list[Any]:
        with self.lock:
            return [r for batch in self.accepted for r in batch]


@contextlib.contextmanager
def receiving(receiver: Receiver) -> Iterator[Receiver]:
    """Serve `receiver` on a free loopback port (its `url` set) for the block."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            records = orjson.loads(body)
            with receiver.lock:
                receiver.requests += 1
                n = receiver.requests
                status = receiver.plan(n, records)
                if 200 <= status < 300:
                    receiver.accepted.append(records)
                else:
                    receiver.refused.append((n, status))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
            pass

    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{port}/ingest"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
