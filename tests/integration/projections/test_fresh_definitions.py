"""Projection files read again when they change, and a build labelled only with the code that built it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.integration.projections.helpers import LogWriter
from tributary.projections.errors import RunError
from tributary.projections.loader import load_current
from tributary.projections.runner import RunSettings, rebuild, status
from tributary.projections.store import Store

pytestmark = pytest.mark.integration

SOURCE = """
from tributary.projections.definition import Fold, Projection, Table

PROJECTION = Projection(
    name="counted",
    version={version},
    topics=("events.account",),
    table=Table.of({{"stream": "text", "n": "bigint"}}, ["stream"]),
    fold=Fold(initial=lambda k: (k, 0), apply=lambda s, r: (s[0], s[1] + 1), result=lambda s: {{"stream": s[0], "n": s[1]}}),
)
"""


def _write(path: Path, version: int, bump_ns: int = 0) -> None:
    path.write_text(SOURCE.format(version=version))
    if bump_ns:  # a later mtime even where the clock's granularity is coarse
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump_ns))


def test_load_current_reads_an_edited_file_again(tmp_path: Path) -> None:
    path = tmp_path / "counted.py"
    _write(path, 1)
    modules = (str(path),)
    first = load_current(modules)
    assert first["counted"].version == 1
    assert load_current(modules) is first  # unchanged: nothing read again
    _write(path, 2, bump_ns=1_000_000_000)
    assert load_current(modules)["counted"].version == 2


def test_a_rebuild_refuses_to_swap_when_its_file_changed_under_it(spark: Any, fresh_db: str, tmp_path: Path) -> None:
    w = LogWriter(tmp_path / "log")
    w.topic("events.account")
    for i in range(6):
        w.append("events.account", f"s{i % 2}", i // 2 + 1, "MoneyDeposited", 1_000 + i, amount="1")
    w.commit()
    w.close()
    path = tmp_path / "counted.py"
    _write(path, 1)
    s = RunSettings(dsn=fresh_db, log_root=tmp_path / "log", modules=(str(path),), spark_master="local[2]")
    [never] = status(s)
    assert never.state == "never run" and never.lag == 6  # never run: all of its topics wait

    def edit(stage: str, done: int, total: int) -> None:  # the user saves v2 while v1 builds
        if done == 0:
            _write(path, 2, bump_ns=1_000_000_000)

    with pytest.raises(RunError, match="changed while 'counted' was being rebuilt"):
        rebuild("counted", s, spark=spark, progress=edit)
    import psycopg

    with psycopg.connect(fresh_db, autocommit=True) as conn:
        builds = Store(conn).builds("counted")
    assert [(b.version, b.status, b.current) for b in builds] == [(1, "failed", False)]


def test_status_refuses_a_log_whose_manifest_is_gone(fresh_db: str, tmp_path: Path) -> None:
    """Segments without a manifest are not "nothing captured yet": status says so instead of a lag of 0."""
    from tributary.log.local import MissingMetadataError

    w = LogWriter(tmp_path / "log")
    w.topic("events.account")
    w.append("events.account", "s0", 1, "MoneyDeposited", 1_000, amount="1")
    w.commit()
    w.close()
    (tmp_path / "log" / "manifest.json").unlink()
    path = tmp_path / "counted.py"
    _write(path, 1)
    s = RunSettings(dsn=fresh_db, log_root=tmp_path / "log", modules=(str(path),), spark_master="local[2]")
    with pytest.raises(MissingMetadataError, match="log verify --repair"):
        status(s)
    (tmp_path / "log").rename(tmp_path / "elsewhere")  # no log at all: nothing captured yet
    [never] = status(s)
    assert never.lag == 0
