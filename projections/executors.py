"""Can the executors see the log? A cheap Spark job run before a cluster run.

With the local log backend the executors read segment files under the log root themselves, so
every executor host needs the root at the same path (shared storage: NFS, a shared volume). A
host without it would fail deep inside a task with a Java stack trace; this check fails first,
with one line naming the hosts. The driver lists the root's top-level entries (its topics and
manifest) and each task checks that they exist where it runs: an empty directory mounted at the
path (a volume that is not the shared one) is caught too.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tributary.projections.errors import RunError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["LogRootUnreachable", "check_log_root"]

_MAX_NAMES = 64  # enough entries to tell the shared root from another directory


class LogRootUnreachable(RunError):
    """Some executor host cannot see the log root (local log backend on a cluster)."""


def _probe(root: str, names: Sequence[str]) -> Callable[[Iterable[int]], Iterator[tuple[str, bool]]]:
    """A task's check: its host, and whether it sees `root` holding `names`."""

    def probe(_: Iterable[int]) -> Iterator[tuple[str, bool]]:
        seen = os.path.isdir(root) and all(os.path.exists(os.path.join(root, n)) for n in names)
        yield socket.gethostname(), seen

    return probe


def check_log_root(spark: SparkSession, root: Path, *, tasks: int | None = None) -> None:
    """Raise `LogRootUnreachable` (one line, naming the hosts) unless every task of a small job,
    spread over the executors (`tasks`, default the cluster's task slots), sees `root` holding
    the entries the driver sees there."""
    names = sorted(os.listdir(root))[:_MAX_NAMES] if root.is_dir() else []
    sc = spark.sparkContext
    n = tasks if tasks is not None else max(int(sc.defaultParallelism), 1)
    seen = sc.parallelize(range(n), n).mapPartitions(_probe(str(root), names)).collect()
    blind = sorted({host for host, ok in seen if not ok})
    if blind:
        raise LogRootUnreachable(
            f"executor host(s) {', '.join(blind)} cannot see the log root {root}: with the local log backend "
            'every executor needs it at the same path, on shared storage (docs/projections.md, "Spark on a cluster")'
        )
