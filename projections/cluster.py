"""Running on a Spark cluster: what the driver checks before it reads anything.

A cluster fails in ways `local[*]` never shows: executors that cannot reach a loopback driver (the
master keeps launching executors that die, and the job waits forever), projection files missing on
a worker, another Python there, a log root it cannot see. Each becomes one line before the run
starts: the driver address is checked from the configuration alone, then one small job (one task
per task slot, with a deadline) asks every executor what it sees.
"""

from __future__ import annotations

import re
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from tributary.hosts import is_loopback
from tributary.projections.errors import RunError

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = [
    "ExecutorsUnavailable",
    "fold_partitions",
    "loopback_driver",
    "master_hosts",
    "ship_files",
    "task_error",
    "within",
]

T = TypeVar("T")
_DOC = '(docs/projections.md, "Spark on a cluster")'


class ExecutorsUnavailable(RunError):
    """No executor ran a task in time: none registered, or none could reach the driver."""


def master_hosts(master: str) -> tuple[str, ...] | None:
    """The hosts a master URL names (`spark://a:7077,b:7077` → a, b); None for `local…` (the
    driver's own JVM) and () for masters naming no host (`yarn`)."""
    if master.startswith("local"):
        return None
    m = re.fullmatch(r"(?:spark|k8s|mesos)://(?:https?://)?([^/]+?)/?", master)
    if m is None:
        return ()
    return tuple(part.rsplit(":", 1)[0].strip("[]") for part in m.group(1).split(","))


def loopback_driver(master: str, conf: Mapping[str, str]) -> str | None:
    """Why the session must not start (one line), or None: a loopback `spark.driver.host` with a
    master on another host gives executors that cannot connect back to the driver."""
    hosts = master_hosts(master)
    driver = conf.get("spark.driver.host", "127.0.0.1")
    if hosts is None or not is_loopback(driver) or (hosts and all(is_loopback(h) for h in hosts)):
        return None
    return (
        f"spark.driver.host is {driver} (loopback) but the master {master} is not on this host: its executors "
        "could not connect back to the driver; set [projections] spark_conf spark.driver.host to an address "
        f"the workers can reach {_DOC}"
    )


def fold_partitions(setting: int | None, conf: Mapping[str, str], default_parallelism: int) -> int:
    """Partitions of a fold's shuffle: `[projections] shuffle_partitions`, else the configuration's
    `spark.sql.shuffle.partitions`, else the cluster's task slots (Spark's `defaultParallelism`)."""
    if setting is not None:
        return setting
    configured = conf.get("spark.sql.shuffle.partitions", "").strip()
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return max(int(default_parallelism), 1)


def shipped_files(modules: Sequence[str]) -> list[Path]:
    """The files a cluster's executors need: each projection file and the `.py` files beside it
    (which it may import), once each."""
    out: dict[Path, None] = {}
    for ref in modules:
        path = Path(ref)
        if ref.endswith(".py") and path.is_file():
            out[path.resolve()] = None
            for sibling in sorted(path.resolve().parent.glob("*.py")):
                out.setdefault(sibling, None)
    return list(out)


def ship_files(sc: SparkContext, modules: Sequence[str]) -> None:
    """Send the projection files (and the files beside them) with the job: each executor gets them
    in its working directory, on `sys.path` (`loader.resolve` loads a file from there when its
    path does not exist on that host). Two files of one name from different directories refuse."""
    names: dict[str, Path] = {}
    for path in shipped_files(modules):
        if path.name in names and names[path.name] != path:
            raise RunError(
                f"[projections] modules: {path} and {names[path.name]} have the same file name; executors "
                "receive the files in one directory: rename one"
            )
        names[path.name] = path
        sc.addPyFile(str(path))


_PY_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): (.*)$", re.M)


def task_error(text: str) -> str | None:
    """The Python error a failed task raised, from Spark's report of it (`PythonException` text,
    a traceback followed by Java frames): its last `SomeError: message` line, or None."""
    found = _PY_ERROR.findall(text)
    for name, message in reversed(found):
        if not name.startswith(("org.", "java.", "py4j.", "scala.")):
            return f"{name}: {message.strip()}"
    return None


def within(sc: SparkContext, seconds: float, job: Callable[[], T], *, what: str) -> T:
    """Run `job` (Spark actions) and cancel it after `seconds`: then raise `ExecutorsUnavailable`
    saying what was waited for. Spark would otherwise wait for executors forever."""
    tag = f"tributary-preflight-{uuid.uuid4().hex}"
    timed_out = threading.Event()

    def cancel() -> None:
        timed_out.set()
        sc.cancelJobsWithTag(tag)

    timer = threading.Timer(seconds, cancel)
    sc.addJobTag(tag)
    timer.start()
    try:
        return job()
    except Exception as exc:
        if timed_out.is_set():
            raise ExecutorsUnavailable(f"no Spark executor ran {what} within {seconds:g} s {_DOC}") from exc
        raise
    finally:
        timer.cancel()
        sc.removeJobTag(tag)


def python_version() -> str:
    """This interpreter's `major.minor`: the driver's and every executor's must be equal (pickled
    functions and Arrow batches cross between them)."""
    return f"{sys.version_info[0]}.{sys.version_info[1]}"
