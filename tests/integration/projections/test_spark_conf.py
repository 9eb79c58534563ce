"""Spark settings from config reach the session a run builds (real SparkSession, in a process of
its own: a process has one session), and the executors' check of the log root fails in one line."""

from __future__ import annotations

import json
import os
import random
import socket
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.integration.projections.helpers import LogWriter
from tests.integration.projections.test_runs import DEP, HERE, WD, _workload
from tests.pg import REPO_ROOT
from tests.waiting import run_process
from tributary.projections.executors import LogRootUnreachable, check_log_root

pytestmark = pytest.mark.integration

CHILD = textwrap.dedent("""
    import json, sys
    from tributary.api.settings.config import Settings
    from tributary.projections.runner import RunSettings, rebuild
    from tributary.projections.spark import get_session
    args = json.loads(sys.argv[1])
    settings = Settings(log={"root": args["root"]}, projections=args["projections"])
    r = rebuild("bank", RunSettings.from_settings(settings, dsn=args["dsn"]))
    conf = get_session().sparkContext.getConf()  # the session the rebuild built
    print(json.dumps({"records": r.records, "conf": {k: conf.get(k) for k in args["projections"]["spark_conf"]}}))
""")


def test_spark_conf_reaches_the_session_a_run_builds(fresh_db: str, tmp_path: Path) -> None:
    root = tmp_path / "log"
    w = LogWriter(root)
    w.topic(DEP)
    w.topic(WD)
    _workload(w, random.Random(3), 20, [0])
    w.commit()
    w.close()
    conf = {
        "spark.driver.host": "localhost",  # wins over the loopback address pinned by default
        "spark.app.name": "from-config",
        "spark.sql.shuffle.partitions": "3",
        "spark.tributary.probe": "x-42",
    }
    projections = {"spark_master": "local[1]", "modules": [str(HERE / "bank_projections.py")], "spark_conf": conf}
    args = json.dumps({"root": str(root), "dsn": fresh_db, "projections": projections})
    out = run_process(
        [sys.executable, "-c", CHILD, args], what="the Spark child", env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"records": 20, "conf": conf}


def test_an_executor_that_cannot_see_the_log_root_fails_in_one_line(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "log"
    (root / "events.deposits").mkdir(parents=True)
    check_log_root(spark, root, tasks=2)  # seen from every task: no error
    missing = tmp_path / "not-mounted-here"  # what an executor without the shared storage sees
    with pytest.raises(LogRootUnreachable) as caught:
        check_log_root(spark, missing, tasks=2)
    message = str(caught.value)
    assert "\n" not in message
    assert socket.gethostname() in message and str(missing) in message
