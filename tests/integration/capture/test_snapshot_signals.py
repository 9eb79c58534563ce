"""Signals into a running capture, through the source's WAL (capture/snapshot/signals.py): the signal
table's rows are never captured as records, a malformed signal is a warning and capture goes on;
`tributary capture snapshot` refuses what it cannot do in one line."""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import (
    capture_progress,
    cli,
    records,
    spawn_capture,
    table_state,
    wait_for,
    write_config,
)
from tributary.log.local import Log, LogError

pytestmark = pytest.mark.integration

SIGNAL_DDL = "CREATE TABLE public.tributary_signal (id text PRIMARY KEY, type text NOT NULL, data text)"


def _state(log_root: Path) -> dict[str, dict[str, object]]:
    """Table t as its topic folds, {} before capture has created the log."""
    try:
        return table_state(log_root, "shop.public.t")
    except LogError:
        return {}


def _setup(dsn: str, tmp_path: Path, rows: int = 5) -> Path:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, %s) g", (rows,))
        conn.execute(SIGNAL_DDL)
    return write_config(
        tmp_path / "t.toml",
        dsn=dsn,
        log_root=tmp_path / "log",
        source_extra='signal_table = "public.tributary_signal"',
    )


def test_signal_rows_are_not_captured_and_a_bad_signal_does_not_stop_capture(fresh_db: str, tmp_path: Path) -> None:
    config = _setup(fresh_db, tmp_path)
    # Only t is included: wal2json is told to send t's changes (add-tables) and the signal table's.
    config.write_text(config.read_text().replace('include = ["public.*"]', 'include = ["public.t"]'))
    log_root = tmp_path / "log"
    proc = spawn_capture(config)
    try:
        wait_for(
            lambda: len(_state(log_root)) == 5,
            timeout=60,
            what="the initial snapshot",
            progress=lambda: capture_progress(log_root),
        )
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("INSERT INTO tributary_signal VALUES ('1', 'bogus', '{}')")
            conn.execute("INSERT INTO tributary_signal VALUES ('2', 'execute-snapshot', '{not json')")
            conn.execute("""INSERT INTO tributary_signal VALUES ('3', 'execute-snapshot', '{"tables": ["t"]}')""")
            conn.execute("SELECT pg_logical_emit_message(true, 'tributary.signal', 'garbage')")
            conn.execute("SELECT pg_logical_emit_message(false, 'tributary.signal', '{\"type\": \"nope\"}')")
            conn.execute("UPDATE tributary_signal SET type = 'x'")
            conn.execute("DELETE FROM tributary_signal")
            conn.execute("INSERT INTO t VALUES (6, 'after the signals')")
        wait_for(
            lambda: len(_state(log_root)) == 6,
            timeout=60,
            what="the change after",
            progress=lambda: capture_progress(log_root),
        )
        assert proc.proc.poll() is None, "capture is still running"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    with Log.open(log_root) as log:
        topics = set(log.topics())
    assert not [t for t in topics if "tributary_signal" in t], topics
    assert not [r for r in records(log_root, "shop.messages") if r.value and b"tributary.signal" in r.value]
    ignored = [line for line in err.splitlines() if "signal ignored" in line]
    assert len(ignored) == 5, err
    assert "WARNING" in ignored[0]
    assert any("row '1': unknown signal type 'bogus'" in line for line in ignored)
    assert any("row '3': table 't' must be written schema.table" in line for line in ignored)
    assert any("not JSON: 'garbage'" in line for line in ignored)


def test_capture_snapshot_refuses_in_one_line(fresh_db: str, tmp_path: Path) -> None:
    config = _setup(fresh_db, tmp_path)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA other")
        conn.execute("CREATE TABLE other.x (id int PRIMARY KEY)")
    for args, why in [
        (["orders"], "table 'orders' must be written schema.table"),
        (["other.x"], "table other.x is not captured by source 'shop'"),
        (["public.tributary_signal"], "table public.tributary_signal is not captured by source 'shop'"),
        (["public.nope"], "table public.nope does not exist in source 'shop'"),
        (["public.t", "--source", "nope"], "unknown source 'nope' (sources: shop)"),
    ]:
        res = cli("capture", "snapshot", *args, "--config", str(config))
        assert res.returncode == 1, (args, res.stdout, res.stderr)
        assert res.stderr.strip() == f"tributary: {why}" or why in res.stderr, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    unreachable = config.with_name("down.toml")
    unreachable.write_text(config.read_text().replace(fresh_db, "postgresql://u:hunter2@127.0.0.1:1/db"))
    res = cli("capture", "snapshot", "public.t", "--config", str(unreachable))
    assert res.returncode == 1
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "shop" in res.stderr and "hunter2" not in res.stderr


def test_capture_snapshot_needs_no_privilege_beyond_connect(fresh_db: str, tmp_path: Path) -> None:
    """pg_logical_emit_message is executable by PUBLIC: a role that can only connect writes the
    signal; an administrator who revokes it gets a one-line refusal."""
    config = _setup(fresh_db, tmp_path)
    role = f"plain_{tmp_path.name[-8:].lower().replace('-', '_')}"
    dbname = fresh_db.rsplit("/", 1)[1]
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT CONNECT ON DATABASE {dbname} TO {role}")
    try:
        plain = config.with_name("plain.toml")
        user_dsn = fresh_db.replace("//postgres@", f"//{role}@", 1)
        assert user_dsn != fresh_db, fresh_db
        plain.write_text(config.read_text().replace(fresh_db, user_dsn))
        res = cli("capture", "snapshot", "public.t", "--config", str(plain))
        assert res.returncode == 0, res.stderr
        assert "snapshot of public.t requested from source shop" in res.stdout
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("REVOKE EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) FROM PUBLIC")
        try:
            res = cli("capture", "snapshot", "public.t", "--config", str(plain))
        finally:
            with psycopg.connect(fresh_db, autocommit=True) as conn:
                conn.execute("GRANT EXECUTE ON FUNCTION pg_logical_emit_message(boolean, text, text) TO PUBLIC")
        assert res.returncode == 1
        assert "cannot write the signal: permission denied" in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    finally:
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")
