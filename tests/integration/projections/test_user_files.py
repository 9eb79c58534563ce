"""A projection file named relative to the config file, importing a helper file beside it, builds in
this process's Spark workers and in a rebuild's child process, whatever the working directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.projections.helpers import LogWriter, dump
from tributary.api.settings.config import load_settings
from tributary.projections.runner import RunSettings, rebuild, rebuild_process

pytestmark = pytest.mark.integration

HELPER = """
def step(state, record):
    return (state[0], state[1] + {weight})
"""

PROJECTION = """
from tributary.projections.definition import Fold, Projection, Table
from {helper} import step

PROJECTION = Projection(
    name="{name}",
    version=1,
    topics=("events.account",),
    table=Table.of({{"stream": "text", "n": "bigint"}}, ["stream"]),
    fold=Fold(initial=lambda k: (k, 0), apply=step, result=lambda s: {{"stream": s[0], "n": s[1]}}),
)
"""


def _project(tmp_path: Path, dsn: str, name: str, helper: str, weight: int) -> RunSettings:
    """A log of 6 events over two streams; `conf/t.toml` naming `proj/<name>.py`, which imports
    `proj/<helper>.py`; the working directory elsewhere."""
    w = LogWriter(tmp_path / "log")
    w.topic("events.account")
    for i in range(6):
        w.append("events.account", f"s{i % 2}", i // 2 + 1, "MoneyDeposited", 1_000 + i, amount="1")
    w.commit()
    w.close()
    (tmp_path / "conf" / "proj").mkdir(parents=True)
    (tmp_path / "conf" / "proj" / f"{helper}.py").write_text(HELPER.format(weight=weight))
    (tmp_path / "conf" / "proj" / f"{name}.py").write_text(PROJECTION.format(helper=helper, name=name))
    config = tmp_path / "conf" / "t.toml"
    config.write_text(
        f'[projections]\nmodules = ["proj/{name}.py"]\nspark_master = "local[2]"\n[log]\nroot = "{tmp_path / "log"}"\n'
    )
    return RunSettings.from_settings(load_settings(config), dsn=dsn)


def test_a_sibling_import_works_in_spark_workers(
    spark: Any, fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    s = _project(tmp_path, fresh_db, "sibling_fold", "sibling_fold_helper", 10)
    assert s.modules == (str((tmp_path / "conf" / "proj" / "sibling_fold.py").resolve()),)
    rebuild("sibling_fold", s, spark=spark)
    assert dump(fresh_db, "views.sibling_fold") == ["(s0,30)", "(s1,30)"]


def test_a_rebuild_process_loads_the_same_files_from_another_directory(
    fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    s = _project(tmp_path, fresh_db, "sibling_child", "sibling_child_helper", 7)
    monkeypatch.chdir(tmp_path)  # the child starts here: only absolute paths find the files
    result = rebuild_process("sibling_child", s)
    assert result.rows == 2
    assert dump(fresh_db, "views.sibling_child") == ["(s0,21)", "(s1,21)"]
