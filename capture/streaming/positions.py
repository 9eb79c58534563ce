"""Which LSN a source's records reach: appended, durable, and safe to confirm to the slot.

Exactly once across `kill -9` rests on these steps, in this order (the daemon runs 3 and 4 in
`CaptureDaemon.commit`; the sources run 1, 2 and 5):

1. **Stage.** A transaction's records are staged and written to segment files as they arrive
   (`Staging`, capture/records/staging.py); nothing is visible until a commit.
2. **Boundary.** At the transaction's end (wal2json's `C`) `boundary` becomes its `nextlsn`, and
   the daemon takes a log mark. A snapshot's boundary is its slot's consistent point.
3. **Commit.** `Log.commit` fsyncs the segments up to the mark and atomically replaces the
   manifest, which records each source's boundary; then `committed()` makes it `durable`.
4. **Confirm.** Only `confirmable()`, the durable LSN, is sent to the slot, so the slot never
   starts later than the manifest's position: a slot that does was made by someone else, and
   what changed in between is not in it (capture/source.py refuses it). An idle source — nothing
   of ours appended-but-uncommitted — turns a later position past which the source sent nothing
   of ours (a keepalive's end, an empty transaction) into a boundary (`idle_boundary`), committed
   without records, so an idle slot does not pin WAL.
5. **Skip on restart.** The stream restarts at the durable LSN; a crash between 3 and 4 makes the
   server re-send transactions the log already holds. `begin` tells them apart: a transaction
   that ends at or before `durable` is skipped whole.

A crash before 3 loses only uncommitted appends (recovery truncates them, the slot was not
confirmed, the server sends them again).
"""

from __future__ import annotations

from tributary.capture.decoding.lsn import Lsn

__all__ = ["OffsetContext"]


class OffsetContext:
    """One source's positions. Pure bookkeeping: it neither commits nor talks to the server."""

    __slots__ = ("boundary", "durable", "idle_lsn", "in_transaction", "skipping")

    def __init__(self) -> None:
        self.durable: Lsn = Lsn.ZERO  # covered by the committed manifest (step 3)
        self.boundary: Lsn | None = None  # end of the last whole transaction appended, not yet durable (step 2)
        self.idle_lsn: Lsn = Lsn.ZERO  # a position past which nothing of ours is pending (step 4)
        self.in_transaction = False
        self.skipping = False  # inside a transaction the log already holds (step 5)

    def start(self, lsn: Lsn) -> None:
        """Streaming starts at `lsn`: the manifest's position, or a snapshot's consistent point."""
        self.durable = self.idle_lsn = lsn

    def slot_created(self, consistent_point: Lsn) -> None:
        """A new slot's consistent point is a boundary (step 2): the snapshot's records, if one
        was taken, are committed in one go with it."""
        self.boundary = consistent_point

    def begin(self, nextlsn: Lsn) -> bool:
        """A transaction begins; True when it is to be appended, False when the log has it (step 5)."""
        self.in_transaction = True
        self.skipping = nextlsn <= self.durable
        return not self.skipping

    def end(self, end: Lsn, *, changes: int) -> bool:
        """A transaction ended at `end` with `changes` of ours; True when that is a new boundary
        the daemon must commit (step 2). One with nothing of ours (another table, a DDL) only
        advances the idle position, or the pending boundary, without forcing a commit."""
        self.in_transaction = False
        if self.skipping:
            self.skipping = False
            return False
        if changes == 0:
            if self.boundary is None:
                self.idle_lsn = max(self.idle_lsn, end)
            else:
                self.boundary = end
            return False
        self.boundary = end
        return True

    def standalone(self, lsn: Lsn) -> None:
        """A non-transactional logical message is its own commit point (step 2)."""
        self.boundary = max(lsn, self.boundary or Lsn.ZERO)

    def keepalive(self, wal_end: Lsn) -> None:
        """The server has sent everything up to `wal_end` (step 4, when nothing is open)."""
        if not self.in_transaction and wal_end > self.idle_lsn:
            self.idle_lsn = wal_end

    def idle_boundary(self) -> bool:
        """Nothing of ours is pending and the source is known to have sent nothing of ours up to
        a later position: make it the boundary (step 4), for the daemon to commit before it
        confirms; True when it did."""
        if self.in_transaction or self.boundary is not None or self.idle_lsn <= self.durable:
            return False
        self.boundary = self.idle_lsn
        return True

    def committed(self) -> None:
        """The daemon made everything up to `boundary` durable (step 3)."""
        if self.boundary is not None:
            self.durable = self.boundary
            self.idle_lsn = max(self.idle_lsn, self.boundary)
            self.boundary = None

    def confirmable(self) -> Lsn:
        """The LSN the slot may be advanced to (step 4): what the manifest holds, never further
        (an idle position is committed first: `idle_boundary`)."""
        return self.durable
