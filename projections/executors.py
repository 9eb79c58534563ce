"""Can the executors run the job? A cheap Spark job run before a cluster run.

Each task reports its host, its Python (`major.minor`, which must be the driver's), whether the
projection modules load there (a missing file or package names its error), and — with the local
log backend — whether it sees the log root.

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

__all__ = ["ExecutorProblem", "LogRootUnreachable", "check_executors", "check_log_root"]

_DOC = '(docs/projections.md, "Spark on a cluster")'
_MAX_NAMES = 64  # enough entries to tell the shared root from another directory


class LogRootUnreachable(RunError):
    """Some executor host cannot see the log root (local log backend on a cluster)."""


class ExecutorProblem(RunError):
    """An executor runs another Python than the driver, or cannot load the projection modules."""


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
    names = _names(root)
    sc = spark.sparkContext
    n = tasks if tasks is not None else max(int(sc.defaultParallelism), 1)
    seen = sc.parallelize(range(n), n).mapPartitions(_probe(str(root), names)).collect()
    blind = sorted({host for host, ok in seen if not ok})
    if blind:
        raise LogRootUnreachable(_unreachable(blind, root))


def _ask(
    root: str | None, names: Sequence[str], modules: Sequence[str], mirror: Sequence[str]
) -> Callable[[Iterable[int]], Iterator[tuple[str, str, bool, str | None]]]:
    """A task's report: its host, its Python, whether it sees `root` holding `names` (True when no
    root is asked about), and the error loading the projection modules raised there (or None)."""

    def ask(_: Iterable[int]) -> Iterator[tuple[str, str, bool, str | None]]:
        from tributary.projections.cluster import python_version
        from tributary.projections.loader import load_shipped

        seen = root is None or (os.path.isdir(root) and all(os.path.exists(os.path.join(root, n)) for n in names))
        try:
            load_shipped(tuple(modules), tuple(mirror))
            problem = None
        except Exception as exc:  # reported to the driver, which stops the run naming it
            problem = f"{type(exc).__name__}: {exc}".splitlines()[0]
        yield socket.gethostname(), python_version(), seen, problem

    return ask


def check_executors(
    spark: SparkSession,
    *,
    root: Path | None,
    modules: Sequence[str],
    mirror: Sequence[str],
    timeout_s: float,
) -> None:
    """One task per task slot of the registered executors (waiting at most `timeout_s` for one):
    raise one line naming the hosts whose Python differs from the driver's, that cannot load the
    projection modules, or (with `root`) cannot see the log root."""
    from tributary.projections.cluster import python_version, within

    sc = spark.sparkContext
    ask = _ask(None if root is None else str(root), _names(root), modules, mirror)
    first = within(sc, timeout_s, lambda: sc.parallelize([0], 1).mapPartitions(ask).collect(), what="a task")
    n = max(int(sc.defaultParallelism), 1)  # the slots registered now, the first executor's at least
    seen = first + within(
        sc, timeout_s, lambda: sc.parallelize(range(n), n).mapPartitions(ask).collect(), what="a task"
    )
    here = python_version()
    other = sorted({f"{host} ({version})" for host, version, _, _ in seen if version != here})
    if other:
        raise ExecutorProblem(
            f"executor host(s) {', '.join(other)} run another Python than the driver ({here}): set "
            f"spark.pyspark.python (or PYSPARK_PYTHON) to a Python {here} on the workers {_DOC}"
        )
    for host, _, _, problem in seen:
        if problem is not None:
            raise ExecutorProblem(f"executor host {host} cannot load [projections] modules: {problem}")
    blind = sorted({host for host, _, ok, _ in seen if not ok})
    if blind and root is not None:
        raise LogRootUnreachable(_unreachable(blind, root))


def _names(root: Path | None) -> list[str]:
    return sorted(os.listdir(root))[:_MAX_NAMES] if root is not None and root.is_dir() else []


def _unreachable(blind: Sequence[str], root: Path) -> str:
    return (
        f"executor host(s) {', '.join(blind)} cannot see the log root {root}: with the local log backend "
        f"every executor needs it at the same path, on shared storage {_DOC}"
    )
