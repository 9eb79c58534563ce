"""The only place the log writes bytes or fsyncs: ENOSPC becomes DiskFullError here.

`os_write` is a module-level hook so a test can inject ENOSPC where no small filesystem
can be mounted.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from tributary.log.local.errors import DiskFullError, LogError

__all__ = ["fsync", "fsync_dir", "os_write", "write_all"]

os_write = os.write
_FULL = (errno.ENOSPC, errno.EDQUOT)


def _translate(exc: OSError, what: str) -> LogError:
    if exc.errno in _FULL:
        return DiskFullError(f"disk full while {what}: nothing new was committed ({exc.strerror})")
    return LogError(f"I/O error while {what}: {exc}")


def write_all(fd: int, data: bytes | memoryview, what: str) -> None:
    """Write every byte (os.write may be partial), translating ENOSPC."""
    view = memoryview(data)
    try:
        while view:
            n = os_write(fd, view)
            view = view[n:]
    except OSError as exc:
        raise _translate(exc, what) from exc


def fsync(fd: int, what: str) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        raise _translate(exc, what) from exc


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (created, renamed, deleted files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd, f"syncing directory {path}")
    finally:
        os.close(fd)
