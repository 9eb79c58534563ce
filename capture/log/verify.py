"""`verify`: read every committed byte and report what is wrong, without stopping at the first."""

from __future__ import annotations

from pathlib import Path

from capture.log.codec import BadLine, decode_line
from capture.log.manifest import Manifest, PartitionState
from capture.log.reader import committed_segments, partition_dir
from capture.log.segment import iter_lines, log_path, segment_name
from capture.log.types import Problem

__all__ = ["verify_log", "verify_partition"]


def verify_log(root: Path, manifest: Manifest) -> list[Problem]:
    problems: list[Problem] = []
    for topic, t in manifest.topics.items():
        for p, state in enumerate(t.partitions):
            problems += verify_partition(root, topic, p, state)
    return problems


def verify_partition(
    root: Path, topic: str, partition: int, state: PartitionState
) -> list[Problem]:
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
                f"partition directory {pdir} is missing "
                f"(manifest: offsets {state.start}..{state.end - 1})",
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
        size = path.stat().st_size
        if limit is not None and size < limit:
            problem(
                base, None, f"the manifest points past the data: {size} bytes, {limit} committed"
            )
        last_in_segment = None
        for pos, line in iter_lines(path, 0, limit):
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
        at_end = base == state.segment and state.nbytes and size >= state.nbytes
        if at_end and last_in_segment is not None and last_in_segment + 1 != state.end:
            problem(
                base,
                last_in_segment,
                f"the manifest says the partition ends at {state.end} "
                f"but the data ends at {last_in_segment + 1}",
            )
    return out
