"""Rebalance notices: every process learns at once that a group's generation moved on.

A rebalance sends `NOTIFY tributary_consumers, '<group>'` in its own transaction (PostgreSQL delivers
it when that transaction commits, to every listening session of every process). One thread per
coordinator listens and counts the notices per group; a stream compares the counts it saw with the
current ones and asks the database again only when they differ, instead of once per batch.

While the thread is not listening (not started yet, the database unreachable) `listening` is False
and callers must ask the database every time; each new LISTEN session bumps `epoch`, because notices
sent while nobody listened are lost.
"""

from __future__ import annotations

import logging
import threading

import psycopg

__all__ = ["CHANNEL", "RebalanceNotices"]

log = logging.getLogger(__name__)

CHANNEL = "tributary_consumers"


class RebalanceNotices:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.listening = False
        self.epoch = 0
        self._counts: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def seen(self, group: str) -> tuple[int, int]:
        """What a caller compares: (epoch, notices of `group`); (-1, -1) while not listening."""
        if not self.listening:
            return -1, -1
        return self.epoch, self._counts.get(group, 0)

    def start(self) -> None:
        """Start listening (idempotent); `listening` turns True once the LISTEN session is up."""
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._listen, name="consumer-rebalance-notices", daemon=True)
                self._thread.start()

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)

    def _listen(self) -> None:
        failure = None
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.epoch += 1
                    self.listening = True
                    failure = None
                    while not self._stop.is_set():
                        for notice in conn.notifies(timeout=0.5):
                            self._counts[notice.payload] = self._counts.get(notice.payload, 0) + 1
            except Exception as exc:  # noqa: BLE001 - callers fall back to asking the database each time
                if repr(exc) != failure:
                    log.warning(
                        "listening for consumer group rebalances failed (retrying): %s",
                        (str(exc) or type(exc).__name__).splitlines()[0],
                    )
                failure = repr(exc)
            finally:
                self.listening = False
            self._stop.wait(1.0)
