"""Spark in cluster mode: a standalone master + worker from the pip-installed PySpark on loopback
runs a rebuild (the executors must find the project through `spark.executorEnv.PYTHONPATH`,
which plain `local[*]` never checks)."""

from __future__ import annotations

import os
import socket
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyspark
import pytest

from tests.integration.projections.helpers import LogWriter, dump
from tests.integration.projections.test_runs import DEP, WD, _workload, settings
from tests.pg import REPO_ROOT
from tests.waiting import run_process, size_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPARK_HOME = Path(pyspark.__file__).parent
CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tributary.projections.runner import RunSettings, rebuild
    from tributary.projections.spark import get_session
    spark = get_session(sys.argv[1], shuffle_partitions=2,
                        conf={"spark.executor.memory": "512m", "spark.cores.max": "1"})
    s = RunSettings(dsn=sys.argv[2], log_root=Path(sys.argv[3]), modules=(sys.argv[4],))
    r = rebuild("bank", s, spark=spark)
    print(r.records, r.rows, flush=True)
    spark.stop()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_PID_DIR": str(tmp_path / "pids"),
        "SPARK_LOG_DIR": str(tmp_path / "logs"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
        "PYSPARK_PYTHON": sys.executable,
    }
    daemon = str(SPARK_HOME / "sbin" / "spark-daemon.sh")
    port = _free_port()
    master = f"spark://127.0.0.1:{port}"
    roles = [
        (
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(_free_port())],
        ),
        (
            "org.apache.spark.deploy.worker.Worker",
            [
                master,
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--webui-port",
                str(_free_port()),
            ],
        ),
    ]
    started = []
    try:
        for cls, args in roles:
            up = run_process(["bash", daemon, "start", cls, "1", *args], what=f"{cls} to start", env=env)
            assert up.returncode == 0, up.stdout + up.stderr
            started.append(cls)
        yield master
    finally:
        for cls in reversed(started):
            run_process(["bash", daemon, "stop", cls, "1"], what=f"{cls} to stop", env=env)


def test_rebuild_on_a_standalone_cluster(spark: Any, standalone: str, fresh_db: str, tmp_path: Path) -> None:
    import random

    root = tmp_path / "log"
    w = LogWriter(root)
    w.topic(DEP)
    w.topic(WD)
    _workload(w, random.Random(5), 60, [0])
    w.commit()
    w.close()
    s = settings(fresh_db, root)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = run_process(  # its executors run in the worker: their logs and scratch files move too
        [sys.executable, "-c", CHILD, standalone, fresh_db, str(root), s.modules[0]],
        what="the rebuild on the cluster",
        env=env,
        progress=lambda: size_of(tmp_path / "logs", tmp_path / "work"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["60", "6"]
    on_cluster = dump(fresh_db, "views.bank")
    from tributary.projections.runner import rebuild

    rebuild("bank", s, spark=spark)  # the same log on the local session: the same table
    assert dump(fresh_db, "views.bank") == on_cluster
