"""Errors of the capture package: one root, one class per thing a user must act on."""

from __future__ import annotations

__all__ = [
    "CaptureError",
    "SlotInUse",
    "SlotLost",
    "SlotMissing",
    "SourceUnreachable",
    "SourceMisconfigured",
    "TransientSourceError",
]


class CaptureError(Exception):
    """Root of capture errors; the message is one line a user can act on."""


class SourceMisconfigured(CaptureError):
    """The source database cannot work as configured (wal_level, wal2json, privileges, keys)."""


class SourceUnreachable(CaptureError):
    """Cannot connect or authenticate; permanent until the user fixes the DSN or the server."""


class SlotMissing(CaptureError):
    """The replication slot this source's log position depends on does not exist."""


class SlotLost(CaptureError):
    """The slot was invalidated (wal_status = lost): WAL it needed is gone."""


class SlotInUse(CaptureError):
    """Another process is streaming from the slot."""


class TransientSourceError(CaptureError):
    """The connection broke (server restart, terminated backend): reconnect with backoff."""
