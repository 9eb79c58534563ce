"""The streaming edge: a psycopg 3 replication connection in COPY_BOTH, nothing else.

Wire format: https://www.postgresql.org/docs/15/protocol-replication.html — 'w' XLogData
(dataStart, walEnd, sendTime, payload), 'k' keepalive (walEnd, sendTime, reply-requested); we
answer with 'r' Standby Status Update. The non-blocking `get_copy_data(1)` + select keeps the GIL free.
"""

from __future__ import annotations

import select
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from tributary.capture import compiled
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.errors import SlotInUse, SlotMissing, SourceUnreachable, TransientSourceError

__all__ = ["Keepalive", "SESSION_SETTINGS", "ReplicationConnection", "SlotInfo", "XLogData", "connect_options"]

_XLOG_HEADER = struct.Struct("!QQQ")
_KEEPALIVE = struct.Struct("!QQB")
_STATUS = struct.Struct("!cQQQQB")
_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in µs since the Unix epoch
_HELD_WAIT_S = 0.002  # how long a held run waits for the rest of its transaction in `read` before
# the daemon's loop runs again (commits of earlier transactions, status)


@dataclass(slots=True)  # not frozen: one per replication message, and a frozen __init__ is slower
class XLogData:
    data_start: int  # LSNs as plain ints on the hot path
    wal_end: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Keepalive:
    wal_end: Lsn
    reply_requested: bool


@dataclass(frozen=True, slots=True)
class SlotInfo:
    slot: str
    consistent_point: Lsn
    snapshot_name: str | None


# Every setting that changes how a value prints, pinned in the startup packet of every capture
# connection, the walsender's included (wal2json prints values with the types' output functions,
# under the walsender's settings): a startup option outranks `ALTER DATABASE/ROLE … SET`, so the
# snapshot and the stream print the same datum the same way whatever the database says. Trap 2:
# timestamps follow TimeZone.
SESSION_SETTINGS = {
    "TimeZone": "UTC",
    "DateStyle": "ISO",
    "IntervalStyle": "postgres",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "lc_monetary": "C",
    "client_encoding": "UTF8",
}


def connect_options() -> dict[str, Any]:
    """Session settings every capture connection pins (`SESSION_SETTINGS`)."""
    return {"options": " ".join(f"-c {k}={v}" for k, v in SESSION_SETTINGS.items())}


def translate_connect_error(exc: psycopg.OperationalError, what: str) -> Exception:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    lowered = text.lower()
    if "password" in lowered or "authentication" in lowered or "does not exist" in lowered or "no pg_hba" in lowered:
        return SourceUnreachable(f"{what}: {text}")
    return TransientSourceError(f"{what}: {text}")


class ReplicationConnection:
    """One walsender session: create/drop slots, stream, report progress."""

    def __init__(self, dsn: str, *, label: str) -> None:
        self.label = label
        try:
            self._conn = psycopg.connect(
                dsn, replication="database", autocommit=True, connect_timeout=10, **connect_options()
            )
        except psycopg.OperationalError as exc:
            raise translate_connect_error(exc, f"source {label!r}") from None
        self._streaming = False

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ReplicationConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- slots -------------------------------------------------------------------
    def create_slot(self, slot: str, *, export_snapshot: bool) -> SlotInfo:
        """Create a wal2json slot; with an exported snapshot, import it before the next command."""
        mode = "EXPORT_SNAPSHOT" if export_snapshot else "NOEXPORT_SNAPSHOT"
        query = sql.SQL("CREATE_REPLICATION_SLOT {} LOGICAL wal2json {}").format(sql.Identifier(slot), sql.SQL(mode))
        row = self._execute(query).fetchone()
        assert row is not None
        return SlotInfo(slot=row[0], consistent_point=Lsn.parse(row[1]), snapshot_name=row[2])

    def drop_slot(self, slot: str) -> None:
        self._execute(sql.SQL("DROP_REPLICATION_SLOT {} WAIT").format(sql.Identifier(slot)))

    # -- streaming ---------------------------------------------------------------
    def start(self, slot: str, start: Lsn, options: Mapping[str, str]) -> None:
        opts = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(k), sql.Literal(v)) for k, v in options.items()
        )
        query = sql.SQL("START_REPLICATION SLOT {} LOGICAL {} ({})").format(
            sql.Identifier(slot), sql.SQL(str(start)), opts
        )
        self._execute(query)
        self._streaming = True

    def fileno(self) -> int:
        return int(self._conn.pgconn.socket)

    def read(
        self, timeout: float, held: Callable[[], tuple[list[bytes], int] | None] | None = None
    ) -> Iterator[XLogData | Keepalive]:
        """Yield every message already buffered; wait up to `timeout` seconds for the first.

        `held`: while it answers (run, room), INSERT documents are not yielded but put on `run`,
        at most `room` at a time, by compiled code (no Python object per change; the session
        holds them back anyway: StreamingSource.held_run)."""
        pgconn = self._conn.pgconn
        get = pgconn.get_copy_data
        take = compiled.take_inserts if held is not None else None
        waited = yielded = False
        until = time.monotonic() + _HELD_WAIT_S if take is not None else 0.0
        while True:
            target = held() if take is not None and held is not None else None
            try:
                if take is not None and target is not None:
                    run, room = target
                    before = len(run)
                    got = take(get, run, room)
                    yielded = yielded or len(run) > before
                    if got is not None:
                        n, data = got
                    elif len(run) - before >= room:
                        continue  # full: `held` hands it on and makes room
                    elif time.monotonic() < until and select.select([pgconn.socket], [], [], _HELD_WAIT_S)[0]:
                        # Mid-transaction the server sends the rest at its own pace: wait for it
                        # here (one select and one recv) rather than through the daemon's loop.
                        pgconn.consume_input()
                        continue
                    else:
                        n, data = 0, b""
                else:
                    n, data = get(1)
            except psycopg.OperationalError as exc:
                raise TransientSourceError(f"source {self.label!r}: replication stream broke: {exc}") from None
            if n == 0:
                if waited or yielded:
                    return
                ready, _, _ = select.select([pgconn.socket], [], [], timeout)
                waited = True
                if not ready:
                    return
                pgconn.consume_input()
                continue
            if n < 0:
                raise TransientSourceError(f"source {self.label!r}: the server ended the replication stream")
            kind = data[0]
            yielded = True
            if kind == 119:  # b"w"; one copy of the payload out of libpq's buffer, none of the header
                start, end, _ = _XLOG_HEADER.unpack_from(data, 1)
                yield XLogData(start, end, bytes(data[25:]))
            elif kind == 107:  # b"k"
                end, _, reply = _KEEPALIVE.unpack_from(data, 1)
                yield Keepalive(Lsn(end), bool(reply))

    def send_status(self, flushed: Lsn, *, now_us: int, reply: bool = False) -> None:
        """Standby Status Update: the slot may drop WAL up to `flushed` (durable in our log)."""
        pos = int(flushed)
        msg = _STATUS.pack(b"r", pos, pos, pos, now_us - _PG_EPOCH_US, 1 if reply else 0)
        pgconn = self._conn.pgconn
        try:
            if pgconn.put_copy_data(msg) != 1 or pgconn.flush() != 0:
                raise TransientSourceError(f"source {self.label!r}: could not send standby status")
        except psycopg.OperationalError as exc:
            raise TransientSourceError(f"source {self.label!r}: could not send standby status: {exc}") from None

    # -- helpers -------------------------------------------------------------------
    def _execute(self, query: sql.Composed | sql.SQL) -> psycopg.Cursor[Any]:
        try:
            return self._conn.execute(query)
        except psycopg.errors.ObjectInUse as exc:
            raise SlotInUse(f"source {self.label!r}: {exc.diag.message_primary}") from None
        except psycopg.errors.UndefinedObject as exc:
            raise SlotMissing(f"source {self.label!r}: {exc.diag.message_primary}") from None
        except psycopg.OperationalError as exc:
            raise TransientSourceError(f"source {self.label!r}: {exc}") from None
