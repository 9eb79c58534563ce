"""Bad environments and slot trouble, each with its one clear line (or a clean recovery)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import capture_progress, changes, cli, spawn_capture, wait_for, write_config
from tests.pg import PgServer
from tests.waiting import wait_exit
from tributary.api.devdb.embedded import EmbeddedPostgres
from tributary.capture.status import read_status

pytestmark = pytest.mark.integration


def _slot(config: Path) -> str:
    return next(line.split('"')[1] for line in config.read_text().splitlines() if line.startswith("slot ="))


@pytest.fixture(scope="module")
def misconfigured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    """A second real cluster with wal_level=replica and wal2json not allow-listed."""
    cluster = EmbeddedPostgres(tmp_path_factory.mktemp("bad") / "pg")
    cluster.up()
    conf = cluster.pgdata / "postgresql.conf"
    text = conf.read_text().replace("wal_level = logical", "wal_level = replica")
    text = text.replace("output_plugin_libraries = 'pgoutput, test_decoding, wal2json'", "")
    conf.write_text(text)  # rewriting keeps the file's owner
    cluster.restart()
    try:
        yield cluster
    finally:
        cluster.destroy()


def test_wal_level_replica_is_named_with_the_fix(misconfigured: EmbeddedPostgres, tmp_path: Path) -> None:
    config = write_config(tmp_path / "t.toml", dsn=misconfigured.dsn(), log_root=tmp_path / "log")
    res = cli("init", "--config", str(config))
    assert res.returncode == 1
    assert "wal_level is 'replica', must be 'logical'" in res.stdout
    assert res.stderr.strip() == "tributary: init: source(s) shop cannot be captured until the problems above are fixed"


def test_wal2json_not_allowed_is_named_with_the_fix(misconfigured: EmbeddedPostgres, tmp_path: Path) -> None:
    if not misconfigured._has_output_plugin_allowlist():
        # Seen on one machine's Debian 15.18 build and not on another's: without the GUC every
        # library may be an output plugin, and there is nothing to refuse.
        pytest.skip("this PostgreSQL build has no output_plugin_libraries allow-list")
    with psycopg.connect(misconfigured.dsn(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET wal_level = logical")
    misconfigured.restart()
    try:
        config = write_config(tmp_path / "t.toml", dsn=misconfigured.dsn(), log_root=tmp_path / "log")
        res = cli("init", "--config", str(config))
        assert res.returncode == 1
        assert "output_plugin_libraries" in res.stdout and "wal2json" in res.stdout
    finally:
        with psycopg.connect(misconfigured.dsn(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET wal_level")
        misconfigured.restart()


def test_slot_held_by_another_process(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(
        tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", source_extra='snapshot = "never"'
    )
    assert cli("init", "--config", str(config)).returncode == 0
    holder = subprocess.Popen(
        [
            str(EmbeddedPostgres(tmp_path).bin_dir / "pg_recvlogical"),
            "-d",
            fresh_db,
            "--slot",
            _slot(config),
            "--start",
            "-f",
            "/dev/null",
            "-o",
            "format-version=2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def slot_held() -> bool:
            with psycopg.connect(fresh_db, autocommit=True) as conn:
                row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (_slot(config),))
                return row.fetchone() == (True,)

        wait_for(slot_held, what="pg_recvlogical holding the slot", progress=lambda: holder.poll())
        res = cli("capture", "--config", str(config), "--until-idle", "1")
        assert res.returncode == 1
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("tributary: source 'shop'") and "active" in last
    finally:
        holder.terminate()
        wait_exit(holder, what="pg_recvlogical to stop")


def test_missing_slot_fails_clearly_unless_when_needed_resnapshots(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 10)")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    assert cli("capture", "--config", str(config), "--until-idle", "1").returncode == 0
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (_slot(config),))
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 1
    assert "does not exist" in res.stderr and 'snapshot = "when_needed"' in res.stderr
    config.write_text(
        config.read_text().replace('include = ["public.*"]', 'include = ["public.*"]\nsnapshot = "when_needed"')
    )
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    assert "taking a new snapshot" in res.stderr
    reads = [c for c in changes(tmp_path / "log", "shop.public.t") if c["op"] == "r"]
    assert len(reads) == 20  # the table re-stated once more, after the first snapshot


def test_second_capture_on_the_same_log_is_refused(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    from tests.integration.capture.helpers import spawn_capture

    first = spawn_capture(config)  # up until told to stop: however long the second takes to start
    try:
        wait_for(  # its status written: it holds the log
            lambda: (read_status(tmp_path / "log") or {}).get("pid") == first.pid,
            what="the first capture's status",
            progress=lambda: capture_progress(tmp_path / "log"),
        )
        second = cli("capture", "--config", str(config), "--until-idle", "1")
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    assert second.returncode == 1
    assert "locked" in second.stderr.strip().splitlines()[-1]


def _source_error(root: Path) -> str:
    """The failed source's reason in the status file, "" while it is not failed."""
    doc = read_status(root) or {}
    return next((str(s.get("error") or "") for s in doc.get("sources", []) if s.get("state") == "failed"), "")


def test_wrong_password_is_one_line_without_the_secret(pg_server: PgServer, fresh_db: str, tmp_path: Path) -> None:
    if pg_server.embedded is None:
        pytest.skip("needs the embedded server to edit pg_hba.conf")
    hba = pg_server.embedded.pgdata / "pg_hba.conf"
    original = hba.read_text()
    with pg_server.admin() as conn:
        conn.execute("DROP ROLE IF EXISTS pw_user")
        conn.execute("CREATE ROLE pw_user LOGIN REPLICATION PASSWORD 'right-secret'")
    hba.write_text(
        "host all pw_user 127.0.0.1/32 scram-sha-256\nhost replication pw_user 127.0.0.1/32 scram-sha-256\n" + original
    )
    with pg_server.admin() as conn:
        conn.execute("SELECT pg_reload_conf()")
    try:
        port = fresh_db.split("@127.0.0.1:")[1].split("/")[0]
        dbname = fresh_db.rsplit("/", 1)[1]
        dsn = f"postgresql://pw_user:wrong-secret@127.0.0.1:{port}/{dbname}"
        config = write_config(tmp_path / "t.toml", dsn=dsn, log_root=tmp_path / "log")
        for args in (("capture", "--until-idle", "1"), ("init",)):
            res = cli(args[0], "--config", str(config), *args[1:])
            assert res.returncode == 1
            assert "password authentication failed" in (res.stdout + res.stderr)
            assert "wrong-secret" not in res.stdout + res.stderr
        # Without --until-idle the daemon stays up and retries the source (a fixed password is picked
        # up without a restart): the source shows `failed` with the reason, and no secret anywhere.
        daemon = spawn_capture(config)
        try:
            wait_for(
                lambda: _source_error(tmp_path / "log"),
                60,
                "the source to show failed",
                progress=lambda: capture_progress(tmp_path / "log"),
            )
            error = _source_error(tmp_path / "log")
            assert "password authentication failed" in error and "wrong-secret" not in error, error
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)
        assert "wrong-secret" not in daemon.err_path.read_text()
    finally:
        hba.write_text(original)
        with pg_server.admin() as conn:
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("DROP ROLE IF EXISTS pw_user")
