"""`kill -9` of a runner at any moment, then a rerun: nothing lost, nothing counted twice."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.projections.helpers import LogWriter, dump
from tests.integration.projections.test_runs import DEP, WD, _workload, settings
from tests.pg import REPO_ROOT
from tests.waiting import wait_exit
from tributary.projections.runner import rebuild, run, status

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHILD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from tributary.projections.runner import RunSettings, run
    from tributary.projections.spark import get_session
    s = RunSettings(dsn=sys.argv[1], log_root=Path(sys.argv[2]), modules=(sys.argv[3],),
                    spark_master="local[1]", shuffle_partitions=2)
    spark = get_session("local[1]", shuffle_partitions=2)
    print("go", flush=True)
    run(sys.argv[4], s, spark=spark)
    print("done", flush=True)
""")


def test_kill_9_during_run_then_rerun(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    name = "bank_daily"
    rng = random.Random()
    root = tmp_path / "log"
    w = LogWriter(root)
    w.topic(DEP)
    w.topic(WD)
    clock = [0]
    _workload(w, rng, 50, clock)
    w.commit()
    s = settings(fresh_db, root)
    run(name, s, spark=spark)
    _workload(w, rng, 50, clock)
    w.commit()
    w.close()
    module = s.modules[0]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, fresh_db, str(root), module, name],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "go"
        time.sleep(rng.uniform(0.5, 8.0))  # somewhere in the fold jobs or the commit
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the child and its JVM and Python workers
        wait_exit(child, what="the killed runner")
        if child.stdout is not None:
            child.stdout.close()
    run(name, s, spark=spark)
    after_crash = dump(fresh_db, f"views.{name}")
    [st] = status(s, name)
    assert st.lag == 0
    rebuild(name, s, spark=spark)
    assert dump(fresh_db, f"views.{name}") == after_crash
