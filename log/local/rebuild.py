"""Segment files the manifest does not account for: the check every open makes, and the rebuild
behind `log verify --repair`.

The manifest is the only record of what is committed, so a root whose segments hold records that
no manifest lists (manifest.json deleted, or restored from an older copy) is not an empty log:
opening it as one would let a writer cut those segments away. Every open refuses it instead, and a
repair rebuilds the missing part of the manifest from the segments themselves. Each topic's config
is kept beside its partitions (`topic.json`, written when the topic is created) for that rebuild.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import orjson

from tributary.log.local.codec import BadLine, decode_line
from tributary.log.local.errors import LogError, MissingMetadataError
from tributary.log.local.manifest import MANIFEST, Manifest, PartitionState, TopicState, read_manifest
from tributary.log.local.segment import iter_lines, list_segments, log_path
from tributary.log.local.types import TopicConfig

__all__ = [
    "TOPIC_META",
    "read_checked",
    "rebuild",
    "require_metadata",
    "topics_with_data",
    "unlisted",
    "write_topic_meta",
]

TOPIC_META = "topic.json"


def _partition_dirs(tdir: Path) -> list[int]:
    try:
        with os.scandir(tdir) as entries:
            return sorted(int(e.name) for e in entries if e.name.isdigit() and e.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _has_data(pdir: Path) -> bool:
    """Any segment file of the partition holds a byte (a fresh topic's empty segments do not)."""
    try:
        bases = list_segments(pdir)
    except FileNotFoundError:
        return False
    for base in bases:
        try:
            if log_path(pdir, base).stat().st_size > 0:
                return True
        except FileNotFoundError:
            continue  # removed by retention while we looked
    return False


def _topic_dirs(root: Path) -> list[str]:
    try:
        with os.scandir(root) as entries:
            return sorted(e.name for e in entries if not e.name.startswith(".") and e.is_dir())
    except FileNotFoundError:
        return []


def _holds_data(tdir: Path) -> bool:
    return any(_has_data(tdir / str(p)) for p in _partition_dirs(tdir))


def topics_with_data(root: Path) -> list[str]:
    """Directories under `root` laid out as topics (numbered partition directories) whose segment
    files hold data: a few directory listings, no file is read."""
    return [n for n in _topic_dirs(root) if _holds_data(root / n)]


def unlisted(manifest: Manifest | None, topics: list[str]) -> list[str]:
    """Those of `topics` that `manifest` does not list."""
    listed = manifest.topics if manifest is not None else {}
    return [t for t in topics if t not in listed]


def read_checked(
    root: Path,
    read: Callable[[], Manifest | None] | None = None,
    owns: Callable[[str], bool] | None = None,
) -> tuple[Manifest | None, list[str]]:
    """The manifest (None: there is none) and the topics holding data that it does not list.
    `read` reads the manifest (the root's by default; a reader's is every owner's union, an
    owner's writer its own) and `owns` says which topic directories it answers for (all by default).

    Only directories the manifest does not list are looked into, so this costs one listing of
    the root when all is well. A writer commits a topic to the manifest before it writes a
    record there, so a topic found holding data is looked up again in a manifest read after
    that: a writer creating topics meanwhile is never mistaken for lost metadata."""
    read = read or (lambda: read_manifest(root))
    names = [n for n in _topic_dirs(root) if owns is None or owns(n)]
    manifest = read()
    missing = [n for n in unlisted(manifest, names) if _holds_data(root / n)]
    if missing:
        manifest = read()
        missing = unlisted(manifest, missing)
    return manifest, missing


def require_metadata(root: Path, manifest: Manifest | None, missing: list[str]) -> None:
    """Refuse topics holding data that `manifest` does not list (see `read_checked`), in one
    line that names the recovery command."""
    if not missing:
        return
    fix = f"run `tributary log verify --repair --root {root}` to rebuild it from the segments"
    if manifest is None:
        raise MissingMetadataError(f"the log at {root} has segment files but no {MANIFEST}, so it is not empty; {fix}")
    names = ", ".join(missing)
    raise MissingMetadataError(
        f"the log at {root} holds topic(s) {names} with segment files that {MANIFEST} does not list; {fix}"
    )


def write_topic_meta(tdir: Path, config: TopicConfig, *, sync: bool = True) -> None:
    """The topic's config beside its partitions (synced; the caller syncs the directory), so a
    rebuilt manifest gets it back."""
    tmp = tdir / f"{TOPIC_META}.tmp"
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(config.to_dict(), option=orjson.OPT_SORT_KEYS))
        f.flush()
        if sync:
            os.fsync(f.fileno())
    os.replace(tmp, tdir / TOPIC_META)


def _topic_config(root: Path, topic: str, partitions: int, notes: list[str]) -> TopicConfig:
    path = root / topic / TOPIC_META
    try:
        config = TopicConfig.from_dict(orjson.loads(path.read_bytes()))
    except FileNotFoundError:
        notes.append(
            f"{topic}: no {TOPIC_META} (created by an older version): rebuilt with {partitions} partitions "
            "and policy none (nothing is compacted or deleted)"
        )
        return TopicConfig(partitions=partitions, policy="none")
    except (orjson.JSONDecodeError, TypeError, ValueError, AttributeError) as exc:
        raise LogError(f"cannot rebuild topic {topic}: {path} is unreadable ({exc})") from None
    if config.partitions != partitions:
        raise LogError(
            f"cannot rebuild topic {topic}: {path} says {config.partitions} partitions but "
            f"{partitions} partition directories are there"
        )
    return config


def _partition(root: Path, topic: str, p: int) -> tuple[PartitionState, str | None]:
    """The committed state a partition's segments stand for: every intact record, a torn last
    line of the newest segment cut (with a note). Damage anywhere else is refused, named."""
    pdir = root / topic / str(p)
    bases = list_segments(pdir)
    if not bases:
        return PartitionState(), None
    last_off = -1
    nbytes = 0
    cut: str | None = None
    for i, base in enumerate(bases):
        path = log_path(pdir, base)
        size = path.stat().st_size
        damaged: str | None = None
        good = 0
        for pos, line in iter_lines(path):
            try:
                if pos + len(line) >= size:
                    raise BadLine("no newline after the last record")  # a write torn by a crash
                off = decode_line(line)[0]
            except BadLine as exc:
                damaged = damaged or f"byte {pos} ({exc})"
                continue
            if damaged is not None:
                raise LogError(
                    f"cannot rebuild {topic}/{p}: {path} is damaged at {damaged} with intact records after it; "
                    "move that segment aside (its records are lost) or restore the manifest from a backup"
                )
            if off <= last_off or off < base:
                raise LogError(f"cannot rebuild {topic}/{p}: offsets out of order in {path} ({off} after {last_off})")
            last_off, good = off, pos + len(line) + 1
        if damaged is not None:
            if i + 1 < len(bases):
                raise LogError(
                    f"cannot rebuild {topic}/{p}: sealed segment {path} is damaged at {damaged}; "
                    "move it aside (its records are lost) or restore the manifest from a backup"
                )
            cut = f"{topic}/{p}: cut a torn last record in {path.name} at byte {good} (it was never committed)"
        nbytes = good
    last_base = bases[-1]
    state = PartitionState(start=bases[0], end=max(last_off + 1, last_base), segment=last_base, nbytes=nbytes)
    return state, cut


def rebuild(root: Path, manifest: Manifest | None, topics: list[str]) -> tuple[Manifest, list[str]]:
    """`manifest` (or an empty one) plus `topics` rebuilt from their segments; what was done, as
    notes. Raises LogError, saying why, for a topic that cannot be rebuilt. Every record found is
    taken as committed: records appended but not yet committed when the manifest was lost are
    kept too (nothing can tell them apart any more)."""
    out = manifest if manifest is not None else Manifest()
    notes = [f"{MANIFEST} was missing: rebuilt from the segment files"] if manifest is None else []
    for topic in topics:
        found = _partition_dirs(root / topic)
        if found != list(range(len(found))):
            raise LogError(
                f"cannot rebuild topic {topic}: partition directories {found} are not 0..{len(found) - 1}; "
                "restore the missing ones or the manifest from a backup"
            )
        config = _topic_config(root, topic, len(found), notes)
        states = []
        for p in found:
            state, cut = _partition(root, topic, p)
            states.append(state)
            if cut:
                notes.append(cut)
        ends = ", ".join(str(s.end) for s in states)
        notes.append(f"{topic}: rebuilt {len(found)} partition(s), policy {config.policy}, end offsets [{ends}]")
        out = out.with_topic(topic, TopicState(config, tuple(states)))
    return out, notes
