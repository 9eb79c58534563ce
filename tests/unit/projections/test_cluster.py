"""What the driver decides alone before a cluster run: the driver address, the shuffle's size, the
files to ship, and the one line a failed task becomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tributary.projections.cluster import fold_partitions, loopback_driver, master_hosts, shipped_files, task_error

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("master", "hosts"),
    [
        ("local[*]", None),
        ("local", None),
        ("spark://10.0.0.5:7077", ("10.0.0.5",)),
        ("spark://a:7077,b:7077", ("a", "b")),
        ("k8s://https://api.example:6443", ("api.example",)),
        ("yarn", ()),
    ],
)
def test_master_hosts(master: str, hosts: tuple[str, ...] | None) -> None:
    assert master_hosts(master) == hosts


@pytest.mark.parametrize(
    ("master", "conf", "refused"),
    [
        ("local[2]", {}, False),
        ("spark://127.0.0.1:7077", {}, False),  # everything on this host: loopback is right
        ("spark://localhost:7077", {"spark.driver.host": "127.0.0.1"}, False),
        ("spark://10.0.0.5:7077", {}, True),  # the default driver address is loopback
        ("spark://10.0.0.5:7077", {"spark.driver.host": "localhost"}, True),
        ("spark://10.0.0.5:7077", {"spark.driver.host": "::1"}, True),
        ("spark://10.0.0.5:7077", {"spark.driver.host": "10.0.0.9"}, False),
        ("spark://127.0.0.1:7077,10.0.0.5:7077", {}, True),
        ("yarn", {}, True),
        ("k8s://https://api:6443", {"spark.driver.host": "driver-svc"}, False),
    ],
)
def test_loopback_driver_with_a_remote_master_is_refused(master: str, conf: dict[str, str], refused: bool) -> None:
    why = loopback_driver(master, conf)
    assert (why is not None) == refused
    if why is not None:
        assert "\n" not in why and "spark.driver.host" in why and master in why


def test_fold_partitions_come_from_the_setting_then_spark_conf_then_the_cluster() -> None:
    assert fold_partitions(None, {}, 6) == 6  # the cluster's task slots, not a fixed 4
    assert fold_partitions(None, {"spark.sql.shuffle.partitions": "9"}, 6) == 9
    assert fold_partitions(3, {"spark.sql.shuffle.partitions": "9"}, 6) == 3
    assert fold_partitions(None, {"spark.sql.shuffle.partitions": "auto"}, 0) == 1


def test_shipped_files_are_the_projection_files_and_their_neighbours(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    for name in ("a/p.py", "a/rules.py", "a/notes.txt"):
        (tmp_path / name).write_text("")
    files = shipped_files([str(tmp_path / "a/p.py"), "tributary.projections.examples.account_balances"])
    assert files == [tmp_path / "a/p.py", tmp_path / "a/rules.py"]


TRACE = """An error occurred while calling o123.collectToPython.
: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 4 times, \
most recent failure: Lost task 0.3 in stage 3.0 (TID 9) (10.231.0.2 executor 1): \
org.apache.spark.api.python.PythonException: Traceback (most recent call last):
  File "/x/pyspark/worker.py", line 1, in main
  File "/x/tributary/projections/loader.py", line 80, in resolve
tributary.projections.errors.DefinitionError: [projections] modules: cannot import 'shop_rules': \
ModuleNotFoundError: No module named 'shop_rules'

\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:1)
java.lang.IllegalStateException: other
"""


def test_task_error_is_the_tasks_python_error() -> None:
    assert task_error(TRACE) == (
        "tributary.projections.errors.DefinitionError: [projections] modules: cannot import 'shop_rules': "
        "ModuleNotFoundError: No module named 'shop_rules'"
    )
    assert task_error("org.apache.spark.SparkException: Job 3 cancelled") is None
