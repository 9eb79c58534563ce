"""Being told when a file in a directory is replaced or written (Linux inotify, through libc).

`ManifestWatch(root, on_change)` calls `on_change()` from the event loop as soon as `root/manifest.json`
is renamed into place or written (the log's commit point is `os.replace` of that file), instead of a
caller finding out on its next poll. Elsewhere than Linux, or when the directory does not exist (yet),
`active` stays False and callers keep polling; `ensure()` tries again.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["ManifestWatch"]

_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_MASK = _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE | _IN_DELETE_SELF | _IN_MOVE_SELF
_HEADER = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)
_NAME = b"manifest.json"


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1  # noqa: B018 - present in every glibc and musl since 2008
    except (OSError, AttributeError):
        return None
    return libc


class ManifestWatch:
    def __init__(self, root: Path, on_change: Callable[[], None]) -> None:
        self.root = Path(root)
        self.on_change = on_change
        self.active = False
        self._libc = _libc()
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None

    def ensure(self) -> bool:
        """Watch the directory if it is not watched yet (call from the event loop); True when watched."""
        if self.active or self._libc is None:
            return self.active
        if self._fd < 0:
            fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                self._libc = None  # out of inotify instances: poll instead, for good
                return False
            self._fd = fd
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(fd, self._read)
        wd = self._libc.inotify_add_watch(self._fd, os.fsencode(self.root), _MASK)
        self.active = wd >= 0
        return self.active

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 64 * 1024)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        changed = False
        at = 0
        while at + _HEADER.size <= len(data):
            _, mask, _, length = _HEADER.unpack_from(data, at)
            name = data[at + _HEADER.size : at + _HEADER.size + length].rstrip(b"\0")
            at += _HEADER.size + length
            if mask & (_IN_IGNORED | _IN_DELETE_SELF | _IN_MOVE_SELF):
                self.active = False  # the directory went away or moved: callers poll until ensure() works again
                changed = True
            elif mask & _IN_Q_OVERFLOW or name == _NAME:
                changed = True
        if changed:
            self.on_change()

    def close(self) -> None:
        if self._fd >= 0:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        self.active = False
