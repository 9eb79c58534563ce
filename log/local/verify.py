"""`verify`: read every committed byte and report what is wrong, without stopping at the first."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from tributary.log.local.codec import BadLine, decode_line
from tributary.log.local.manifest import Manifest, PartitionState
from tributary.log.local.owners import read_union
from tributary.log.local.reader import committed_segments, open_segment, partition_dir
from tributary.log.local.segment import iter_lines, log_path, segment_name
from tributary.log.local.types import Problem

__all__ = ["verify_log", "verify_partition"]


def verify_log(root: Path, manifest: Manifest) -> list[Problem]:
    problems: list[Problem] = []
    for topic, t in manifest.topics.items():
        for p, state in enumerate(t.partitions):
            found = verify_partition(root, topic, p, state)
            if found:  # the active segment of our snapshot may since have been sealed and compacted
                fresh = read_union(root)
                newer = fresh.partition(topic, p) if fresh and topic in fresh.topics else None
                if newer is not None and newer.segment != state.segment:
                    found = verify_partition(root, topic, p, newer)
            problems += found
    return problems


def verify_partition(root: Path, topic: str, partition: int, state: PartitionState) -> list[Problem]:
    pdir = partition_dir(root, topic, partition)
    out: list[Problem] = []

    def problem(base: int | None, offset: int | None, message: str) -> None:
        seg = "-" if base is None else f"{segment_name(base)}.log"
        out.append(Problem(topic, partition, seg, offset, message))

    if not pdir.is_dir():
        if state.end > state.start:
            problem(
                None,
                None,
                f"partition directory {pdir} is missing (manifest: offsets {state.start}..{state.end - 1})",
            )
        return out
    bases = committed_segments(pdir, state)
    if state.nbytes and state.segment not in bases:
        problem(
            state.segment,
            None,
            f"segment is missing but the manifest says {state.nbytes} bytes are committed",
        )
    prev = -1
    for base in bases:
        limit = state.nbytes if base == state.segment else None
        path = log_path(pdir, base)
        f = open_segment(path)
        if f is None:
            continue  # a sealed segment emptied by the cleaner since listed (the active one is checked above)
        with f:
            size = os.fstat(f.fileno()).st_size
            last_in_segment, prev = _check_lines(path, f, base, limit, prev, problem)
        if limit is not None and size < limit:
            problem(base, None, f"the manifest points past the data: {size} bytes, {limit} committed")
        at_end = base == state.segment and state.nbytes and size >= state.nbytes
        if at_end and last_in_segment is not None and last_in_segment + 1 != state.end:
            problem(
                base,
                last_in_segment,
                f"the manifest says the partition ends at {state.end} but the data ends at {last_in_segment + 1}",
            )
    return out


def _check_lines(
    path: Path,
    f: BinaryIO,
    base: int,
    limit: int | None,
    prev: int,
    problem: Callable[[int | None, int | None, str], None],
) -> tuple[int | None, int]:
    """Every line of one open segment version; returns (its last offset, the highest so far)."""
    last_in_segment = None
    for pos, line in iter_lines(path, 0, limit, file=f):
        try:
            off = decode_line(line)[0]
        except BadLine as exc:
            torn = not line.endswith(b"}")
            what = "truncated mid-record" if torn else str(exc)
            problem(
                base,
                exc.offset if exc.offset is not None else prev + 1,
                f"{what} at byte {pos}",
            )
            continue
        if off <= prev or off < base:
            problem(base, off, f"offsets out of order ({off} after {prev})")
        prev = max(prev, off)
        last_in_segment = off
    return last_in_segment, prev
