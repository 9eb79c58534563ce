"""`status` shows a projection `done` only when caught up, and a rebuild as under way only while a
runner holds the projection's lock (not a build row left `building` by a killed process)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.integration.projections.helpers import LogWriter
from tributary.projections.loader import load_current
from tributary.projections.runner import RunSettings, status
from tributary.projections.store import Store

pytestmark = pytest.mark.integration

SOURCE = """
from tributary.projections.definition import Projection, Table

PROJECTION = Projection(
    name="counted",
    version=1,
    topics=("events.account",),
    table=Table.of({"stream": "text", "n": "bigint"}, ["stream"]),
    build=lambda df: df,
)
"""


def _state(s: RunSettings, rebuilding: frozenset[str] = frozenset()) -> tuple[str, str]:
    [st] = status(s, rebuilding=rebuilding)
    return st.state, st.label


def test_states_follow_the_lag_and_the_lock(fresh_db: str, tmp_path: Path) -> None:
    w = LogWriter(tmp_path / "log")
    w.topic("events.account")
    for i in range(6):
        w.append("events.account", f"s{i % 2}", i // 2 + 1, "MoneyDeposited", 1_000 + i, amount="1")
    w.commit()
    w.close()
    (tmp_path / "counted.py").write_text(SOURCE)
    s = RunSettings(dsn=fresh_db, log_root=tmp_path / "log", modules=(str(tmp_path / "counted.py"),))
    projection = load_current(s.modules)["counted"]
    assert _state(s) == ("never run", "never run")
    assert _state(s, frozenset({"counted"})) == ("building", "building")  # an API rebuild starting
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        store = Store(conn)
        store.ensure()
        store.swap(store.new_build(projection))  # serving, its status `done`, nothing read yet
        assert _state(s) == ("behind", "behind (6 records)")
        assert store.try_lock("counted")  # a rebuild under way: the lock held, its build `building`
        store.new_build(projection)
        assert _state(s) == ("rebuilding", "rebuilding")
    # its process killed: the lock went with its session, the build row stays `building`
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        assert [b.status for b in Store(conn).builds("counted")] == ["done", "building"]
    assert _state(s) == ("behind", "behind (6 records)")
