"""A capture killed -9 while one of its statements runs on the source leaves nothing running
there: the server notices its client is gone and cancels the statement (capture/database/session_guard.py)."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import cli, spawn_capture, wait_for, write_config
from tests.integration.capture.test_chunked_snapshot import _chunked
from tests.integration.capture.test_resnapshot import FILL, TABLES
from tributary.capture.database.session_guard import CHECK_INTERVAL_MS

pytestmark = pytest.mark.integration


def _active(dsn: str, app: str) -> list[tuple[str, str | None, str]]:
    """The backends of `app` running a statement: (backend type, wait event type, query)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT backend_type, wait_event_type, query FROM pg_stat_activity "
            "WHERE application_name = %s AND state = 'active'",
            (app,),
        ).fetchall()
    return [(str(r[0]), r[1], str(r[2])) for r in rows]


def test_a_statement_of_a_killed_capture_is_cancelled(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=2000))
    app = f"capture_{uuid.uuid4().hex[:8]}"
    dsn = f"{fresh_db}?application_name={app}"
    config = _chunked(write_config(tmp_path / "t.toml", dsn=dsn, log_root=tmp_path / "log"), 500)
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr

    # The table locked: the chunked re-snapshot's first read of it waits, a statement running
    # for as long as the lock is held.
    with psycopg.connect(fresh_db) as locker:
        locker.execute("LOCK TABLE items IN ACCESS EXCLUSIVE MODE")
        capture = spawn_capture(config)
        try:
            res = cli("capture", "snapshot", "public.items", "--config", str(config))
            assert res.returncode == 0, res.stderr

            def waiting() -> bool:
                return any(wait == "Lock" and "items" in query for _, wait, query in _active(fresh_db, app))

            wait_for(waiting, timeout=120, what="capture's read of the locked table")
        finally:
            os.kill(capture.pid, signal.SIGKILL)
            capture.wait(timeout=60)
        # generous: the server checks its client every CHECK_INTERVAL_MS
        wait_for(
            lambda: not _active(fresh_db, app),
            timeout=60 + CHECK_INTERVAL_MS / 1000,
            what="the killed capture's statements to end",
            progress=lambda: str(_active(fresh_db, app)),
        )
        locker.rollback()
