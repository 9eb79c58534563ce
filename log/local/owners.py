"""Topic ownership: several writer processes on one root, each writing its own topics.

The default owner (capture) keeps `<root>/.lock` and `<root>/manifest.json`; a named owner (e.g.
`projection.orders.3`) keeps `<root>/.owners/<name>/.lock` and its own `manifest.json` there, and
commits exactly as the default does (fsync, then an atomic replace of ITS manifest), so owners
never wait for each other. A topic's directory holds its claim file `.owner` (the owner's name,
empty for the default owner), made with link(2) when the topic is created: of two owners racing to
create one name exactly one wins. A topic directory without a claim predates ownership and is the
default owner's. Readers see the union of every owner's committed manifest.

A named owner that crashed between its claim and the commit that lists the topic (create_topic
commits it at once) leaves a claim nobody would honour: such a claim, whose owner holds no lock and
whose manifest does not list the topic, is taken over by the next owner that creates the topic. The
check and the take-over happen under the stale owner's own lock, so claimants take turns (exactly
one wins) and that owner cannot start meanwhile.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

from tributary.log.local import _fileio
from tributary.log.local.errors import LogError
from tributary.log.local.manifest import MANIFEST, Manifest, TopicState, decode_manifest, read_manifest

__all__ = ["CLAIM", "LOCK", "OWNERS", "claim", "claimed_by", "describe", "home", "owner_names", "read_union"]

OWNERS = ".owners"
CLAIM = ".owner"
LOCK = ".lock"  # in an owner's home: flock(2)ed by its writer while it is open
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")


def home(root: Path, owner: str) -> Path:
    """Where an owner keeps its lock and manifest: the root itself for the default owner ("")."""
    if not owner:
        return root
    if not _NAME.match(owner):
        raise LogError(f"invalid log owner name {owner!r}: use letters, digits, '.', '_' and '-'")
    return root / OWNERS / owner


def describe(owner: str) -> str:
    """An owner as a user reads it in an error."""
    return f"owner {owner!r}" if owner else "the default writer (capture)"


def owner_names(root: Path) -> list[str]:
    """The named owners that ever opened a writer on `root`."""
    try:
        with os.scandir(root / OWNERS) as entries:
            return sorted(e.name for e in entries if e.is_dir() and _NAME.match(e.name))
    except FileNotFoundError:
        return []


def claimed_by(root: Path, topic: str) -> str:
    """The owner of `topic` ("" for the default owner, which also holds unclaimed topics)."""
    try:
        return (root / topic / CLAIM).read_text()
    except FileNotFoundError:
        return ""


def claim(tdir: Path, owner: str, *, sync: bool = True) -> str:
    """Claim the topic directory `tdir` for `owner` unless another holds it; returns the holder.

    The claim is written whole to a file of this thread's, then linked to its name: link(2)
    fails when the name exists, so the claim is atomic and never seen half written."""
    tmp = tdir / f"{CLAIM}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _fileio.write_all(fd, owner.encode(), f"writing {tmp}")
        if sync:
            _fileio.fsync(fd, f"syncing {tmp}")
    finally:
        os.close(fd)
    try:
        os.link(tmp, tdir / CLAIM)
    except FileExistsError:
        _take_over_stale(tdir, tmp, sync=sync)
    finally:
        tmp.unlink(missing_ok=True)
    return claimed_by(tdir.parent, tdir.name)


def _take_over_stale(tdir: Path, tmp: Path, *, sync: bool) -> None:
    """Replace the claim of `tdir` by `tmp` if it is stale: a named owner's that holds no lock and
    never committed the topic. Checked and replaced under that owner's lock (see the module doc)."""
    root, topic = tdir.parent, tdir.name
    holder = claimed_by(root, topic)
    if not holder or not _NAME.match(holder):
        return  # capture's claims, and anything unreadable as an owner, stand
    with _lock_of(home(root, holder)) as idle:
        if not idle or claimed_by(root, topic) != holder:
            return  # the owner runs, or another claimant took the topic over first
        committed = read_manifest(home(root, holder))
        if committed is not None and topic in committed.topics:
            return
        os.replace(tmp, tdir / CLAIM)
        if sync:
            _fileio.fsync_dir(tdir)


@contextlib.contextmanager
def _lock_of(owner_home: Path) -> Iterator[bool]:
    """Hold an owner's lock for the block if no one does (True), else False at once."""
    owner_home.mkdir(parents=True, exist_ok=True)
    fd = os.open(owner_home / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the flock


# A named owner's manifest as last read, by path, with the identity of the file it came from: a
# commit replaces the file (a new inode), so a reader refreshing every few milliseconds re-reads
# only the owners that committed since, not every owner's manifest every time.
_seen: dict[Path, tuple[tuple[int, int, int], Manifest]] = {}


def _owner_manifest(path: Path) -> Manifest | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        _seen.pop(path, None)
        return None
    ident = (st.st_ino, st.st_mtime_ns, st.st_size)
    cached = _seen.get(path)
    if cached is not None and cached[0] == ident:
        return cached[1]
    try:
        manifest = decode_manifest(path.read_bytes(), str(path))
    except FileNotFoundError:  # replaced between the stat and the read: the next refresh sees the new one
        return cached[1] if cached is not None else None
    _seen[path] = (ident, manifest)
    return manifest


def read_union(root: Path) -> Manifest | None:
    """Every owner's committed manifest as one (None: no owner ever committed). Owners' topics
    are disjoint; their source positions are each their own, by name."""
    named = [_owner_manifest(home(root, n) / MANIFEST) for n in owner_names(root)]
    found = [m for m in [read_manifest(root), *named] if m]
    if not found:
        return None
    topics: dict[str, TopicState] = {}
    positions: dict[str, str] = {}
    for m in found:
        topics.update(m.topics)
        positions.update(m.positions)
    return Manifest(sum(m.generation for m in found), topics, positions)
