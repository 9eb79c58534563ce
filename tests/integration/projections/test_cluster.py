"""Projections on a Spark standalone cluster of two hosts (`standalone.Cluster`: one worker in a
network namespace of its own, where the projection files' directory is empty).

The driver runs in a child process (one SparkSession per process) against the session's cluster;
the same log rebuilt on the local session gives the table it must equal.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.integration.projections.helpers import LogWriter, dump
from tests.integration.projections.standalone import Cluster, Forwarder, free_port
from tests.integration.projections.test_runs import DEP, WD, _workload
from tests.pg import REPO_ROOT
from tests.waiting import run_process, size_of, wait_exit, wait_progress
from tributary.projections.runner import RunSettings, rebuild

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHILD = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from tributary.projections.errors import ProjectionError
    from tributary.projections.runner import RunSettings, rebuild
    from tributary.projections.spark import stop_session
    a = json.loads(sys.argv[1])
    s = RunSettings(dsn=a["dsn"], executor_dsn=a["executor_dsn"], log_root=Path(a["root"]),
                    modules=tuple(a["modules"]), spark_master=a["master"], spark_conf=a["conf"],
                    executor_timeout_s=a.get("timeout", 120.0))
    try:
        r = rebuild(a["name"], s)
        print(json.dumps({"records": r.records, "rows": r.rows}), flush=True)
    except ProjectionError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
    finally:
        stop_session()
""")

RULES = """\
from tributary.projections.examples import account_balances

TOPICS = ("events.deposits", "events.withdrawals")


def bank(name, apply=account_balances.apply):
    from tributary.projections.definition import Fold, Projection

    return Projection(name=name, version=1, topics=TOPICS, table=account_balances.TABLE,
                      fold=Fold(account_balances.initial, apply, account_balances.result))
"""

PROJECTIONS = """\
import os
import time

from cluster_rules import bank  # the file beside this one: shipped with it
from tributary.projections.examples import account_balances

GATE = {gate!r}


def gated(state, record):
    # Every fold task waits here until the test opens the gate, saying which network it runs in.
    if not os.path.exists(os.path.join(GATE, "open")):
        net = os.readlink("/proc/self/ns/net")
        open(os.path.join(GATE, f"reached {{net}} {{os.getpid()}}"), "w").close()
        while not os.path.exists(os.path.join(GATE, "open")):
            time.sleep(0.05)
    return account_balances.apply(state, record)


PROJECTIONS = [bank("cbank"), bank("cbank_gated", gated)]
"""


def _no_namespaces() -> str | None:
    """Why this machine cannot make the cluster's second host, or None."""
    if os.geteuid() != 0:
        return "network and mount namespaces need root"
    missing = [tool for tool in ("ip", "unshare", "mount") if shutil.which(tool) is None]
    return f"no {', '.join(missing)} command here" if missing else None


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    why = _no_namespaces()
    if why is not None:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("standalone")
    hidden = base / "hidden"
    hidden.mkdir()
    net = 1 + os.getpid() % 250
    c = Cluster(
        base=base,
        hidden=hidden,
        netns=f"trb-spark-{os.getpid()}",
        veth=f"trb{os.getpid() % 100000}",
        host_ip=f"10.231.{net}.1",
        ns_ip=f"10.231.{net}.2",
        port=0,
        ui_port=0,
    )
    try:
        c.start_network()
        c.port, c.ui_port = free_port(c.host_ip), free_port(c.host_ip)
        c.start()
        yield c
    finally:
        c.close()


@pytest.fixture
def forwarder(cluster: Cluster, fresh_db: str) -> Iterator[str]:
    """`fresh_db` as the executors reach it: through the cluster's host address."""
    u = urlsplit(fresh_db)
    f = Forwarder(cluster.host_ip, (u.hostname or "127.0.0.1", u.port or 5432))
    try:
        yield urlunsplit(u._replace(netloc=f"{u.username}@{cluster.host_ip}:{f.port}"))
    finally:
        f.close()


def _log(root: Path, n: int = 80) -> None:
    w = LogWriter(root)
    w.topic(DEP)
    w.topic(WD)
    _workload(w, random.Random(5), n, [0])
    w.commit()
    w.close()


def _projection_files(cluster: Cluster, gate: Path) -> str:
    (cluster.hidden / "cluster_rules.py").write_text(RULES)
    path = cluster.hidden / "cluster_projections.py"
    path.write_text(PROJECTIONS.format(gate=str(gate)))
    return str(path)


def _args(cluster: Cluster, dsn: str, executor_dsn: str, root: Path, modules: list[str], name: str, **conf: str) -> str:
    return json.dumps(
        {
            "dsn": dsn,
            "executor_dsn": executor_dsn,
            "root": str(root),
            "modules": modules,
            "master": cluster.master,
            "name": name,
            "conf": {
                "spark.driver.host": cluster.host_ip,
                "spark.driver.bindAddress": cluster.host_ip,
                "spark.executor.memory": "512m",
                "spark.executor.cores": "1",
                "spark.cores.max": "2",
                "spark.locality.wait": "0",
                **conf,
            },
        }
    )


def _env(cluster: Cluster, pythonpath: str = str(REPO_ROOT)) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": pythonpath, "SPARK_LOCAL_IP": cluster.host_ip}


def _drive(cluster: Cluster, args: str, env: dict[str, str]) -> dict[str, Any]:
    out = run_process(
        [sys.executable, "-c", CHILD, args],
        what="a rebuild on the cluster",
        env=env,
        progress=lambda: size_of(cluster.base / "logs", cluster.base / "work"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _local(fresh_db: str, root: Path, modules: list[str], name: str, spark: Any) -> list[str]:
    rebuild(name, RunSettings(dsn=fresh_db, log_root=root, modules=tuple(modules), shuffle_partitions=2), spark=spark)
    return dump(fresh_db, f"views.{name}")


def test_a_loopback_driver_with_a_remote_master_is_refused(cluster: Cluster, fresh_db: str, tmp_path: Path) -> None:
    modules = [_projection_files(cluster, tmp_path)]
    args = json.loads(_args(cluster, fresh_db, fresh_db, tmp_path, modules, "cbank"))
    del args["conf"]["spark.driver.host"], args["conf"]["spark.driver.bindAddress"]
    out = run_process([sys.executable, "-c", CHILD, json.dumps(args)], what="a refused session", env=_env(cluster))
    error = json.loads(out.stdout.strip().splitlines()[-1])["error"]
    assert error.startswith(f"spark.driver.host is 127.0.0.1 (loopback) but the master {cluster.master}"), error


def test_no_executor_is_a_timeout_with_a_message(cluster: Cluster, fresh_db: str, tmp_path: Path) -> None:
    root = tmp_path / "log"
    _log(root, 4)
    modules = [_projection_files(cluster, tmp_path)]
    conf = {"spark.executor.memory": "64g", "spark.scheduler.maxRegisteredResourcesWaitingTime": "1s"}
    args = json.loads(_args(cluster, fresh_db, fresh_db, root, modules, "cbank", **conf))
    args["timeout"] = 5.0  # no worker has 64g: no executor ever starts
    out = run_process(
        [sys.executable, "-c", CHILD, json.dumps(args)], what="a run without executors", env=_env(cluster)
    )
    error = json.loads(out.stdout.strip().splitlines()[-1])["error"]
    assert error.startswith("no Spark executor ran a task within 5 s"), error


def test_an_import_missing_on_a_worker_is_named(
    cluster: Cluster, fresh_db: str, forwarder: str, tmp_path: Path
) -> None:
    root = tmp_path / "log"
    _log(root, 4)
    lib = cluster.hidden / "lib"  # on the driver's PYTHONPATH; empty on the namespaced worker
    lib.mkdir(exist_ok=True)
    (lib / "shop_helpers.py").write_text("ONE = 1\n")
    (tmp_path / "p").mkdir()
    module = tmp_path / "p" / "needs_lib.py"
    module.write_text("import shop_helpers\nfrom cluster_rules import bank\nPROJECTION = bank('cneeds')\n")
    (tmp_path / "p" / "cluster_rules.py").write_text(RULES)
    args = _args(cluster, fresh_db, forwarder, root, [str(module)], "cneeds")
    result = _drive(cluster, args, _env(cluster, f"{REPO_ROOT}:{lib}"))
    assert result["error"].startswith(f"executor host {os.uname().nodename} cannot load [projections] modules: "), (
        result
    )
    assert "No module named 'shop_helpers'" in result["error"] and "\n" not in result["error"]


def test_a_worker_killed_mid_rebuild(
    spark: Any, cluster: Cluster, fresh_db: str, forwarder: str, tmp_path: Path
) -> None:
    """Last in the module: it kills the namespaced worker for good."""
    root = tmp_path / "log"
    _log(root, 200)
    gate = tmp_path / "gate"
    gate.mkdir()
    modules = [_projection_files(cluster, gate)]
    args = _args(cluster, fresh_db, forwarder, root, modules, "cbank_gated")
    with (tmp_path / "out").open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, args], stdout=out, stderr=subprocess.STDOUT, env=_env(cluster)
        )
    try:
        ours = os.readlink("/proc/self/ns/net")
        wait_progress(  # a fold task on the other host is inside the fold
            lambda: any(f.name.startswith("reached") and ours not in f.name for f in gate.iterdir()),
            lambda: size_of(cluster.base / "logs", cluster.base / "work", tmp_path / "out"),
            what="a fold task on the namespaced worker",
        )
        cluster.kill_ns_worker()
        (gate / "open").touch()
        wait_exit(
            child,
            what="the rebuild to finish on the remaining worker",
            progress=lambda: size_of(cluster.base / "logs", tmp_path / "out"),
        )
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    result = json.loads((tmp_path / "out").read_text().strip().splitlines()[-1])
    assert result == {"records": 200, "rows": 6}, result
    on_cluster = dump(fresh_db, "views.cbank_gated")
    assert _local(fresh_db, root, modules, "cbank", spark) == on_cluster
