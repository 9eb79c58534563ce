"""What `init` and `capture` tell a user: a table allowed without a key stays allowed (the config
keeps the choice, and `init` prints the line to add); a source it cannot reach is said so; a
malformed DSN is one line; off a terminal, capture logs each phase and a progress line now and then."""

from __future__ import annotations

import signal
from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import capture_progress, cli, spawn_capture, wait_for, write_config

pytestmark = pytest.mark.integration

LINE = 'allow_without_key = ["public.page_views"]'


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def test_a_table_allowed_without_a_key_stays_allowed_through_the_config(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, "CREATE TABLE page_views (path text, at timestamptz)", "CREATE TABLE ok (id int PRIMARY KEY)")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    refused = cli("init", "--config", str(config))
    assert refused.returncode == 1
    assert f"add `{LINE}` to the config's [[sources]] entry 'shop'" in refused.stdout, refused.stdout
    # the flag allows it for this run, and says what keeps it so
    flagged = cli("init", "--config", str(config), "--allow-without-key", "public.page_views")
    assert flagged.returncode == 0, flagged.stdout + flagged.stderr
    assert "for this run only" in flagged.stdout and LINE in flagged.stdout, flagged.stdout
    # the line printed, added to the config: every later init passes without the flag
    kept = write_config(tmp_path / "kept.toml", dsn=fresh_db, log_root=tmp_path / "log", source_extra=LINE)
    again = cli("init", "--config", str(kept))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "public.page_views: no primary key or replica identity" in again.stdout and "(allowed)" in again.stdout
    assert "for this run only" not in again.stdout
    # and the flag adds to the config's list
    _sql(fresh_db, "CREATE TABLE clicks (x int)")
    both = cli("init", "--config", str(kept), "--allow-without-key", "public.clicks")
    assert both.returncode == 0, both.stdout + both.stderr
    assert 'allow_without_key = ["public.clicks", "public.page_views"]' in both.stdout, both.stdout


def test_allow_without_key_entries_are_schema_qualified(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "t.toml",
        dsn="postgresql://x@127.0.0.1:1/db",
        log_root=tmp_path / "log",
        source_extra='allow_without_key = ["page_views"]',
    )
    bad = cli("init", "--config", str(config))
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.strip().splitlines() == [
        f"tributary: config error in {config}: [[sources]] allow_without_key: "
        "each entry must be schema.table, not 'page_views'"
    ], bad.stderr


def test_a_malformed_dsn_is_one_line_and_an_unreachable_source_is_said_so(tmp_path: Path) -> None:
    config = write_config(tmp_path / "t.toml", dsn="postgres:/x@localhost:1", log_root=tmp_path / "log")
    bad = cli("init", "--config", str(config))
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "[[sources]] dsn: not a valid DSN" in lines[0], bad.stderr
    assert "postgres:/x" not in bad.stderr  # a DSN may hold a password: never echoed
    config = write_config(tmp_path / "u.toml", dsn="postgresql://x@127.0.0.1:1/db", log_root=tmp_path / "log")
    unreachable = cli("init", "--config", str(config))
    assert unreachable.returncode == 1
    assert "source shop (could not connect)" in unreachable.stdout, unreachable.stdout
    assert "0 tables" not in unreachable.stdout


def test_capture_off_a_terminal_logs_each_phase_and_its_progress(
    fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY)", "INSERT INTO t SELECT generate_series(1, 3)")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    assert cli("init", "--config", str(config)).returncode == 0
    monkeypatch.setenv("TRIBUTARY_CAPTURE__PROGRESS_INTERVAL_S", "0.5")
    capture = spawn_capture(config)  # stderr to a file: not a terminal
    try:
        log = capture.err_path.read_text
        wait_for(
            lambda: "source shop: streaming, 0 changes" in log(),
            120,
            "a progress line",
            progress=lambda: capture_progress(tmp_path / "log"),
        )
        _sql(fresh_db, "INSERT INTO t VALUES (4)")
        wait_for(
            lambda: "source shop: streaming, 1 change (" in log(),
            120,
            "a progress line after a change",
            progress=lambda: capture_progress(tmp_path / "log"),
        )
    finally:
        capture.send_signal(signal.SIGTERM)
        capture.wait(timeout=60)
    text = log()
    assert "source shop: snapshot started (consistent)" in text, text
    assert "source shop: snapshot finished: 3 rows at " in text, text
    assert "source shop: streaming from LSN " in text, text
    assert text.index("snapshot finished") < text.index("streaming from LSN"), text
