"""The embedded cluster as `tributary pg up|down|dsn` and the fixtures use it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.pg import PgServer
from tests.waiting import run_process
from tributary.api.devdb import embedded
from tributary.api.devdb.embedded import EmbeddedPostgres, PgError, free_port, listening_socket

pytestmark = pytest.mark.integration


def test_server_has_logical_decoding_and_wal2json(pg_server: PgServer, fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        assert conn.execute("SHOW wal_level").fetchone() == ("logical",)
        conn.execute("CREATE TABLE t (id int primary key)")
        conn.execute("SELECT pg_create_logical_replication_slot('probe', 'wal2json')")
        conn.execute("INSERT INTO t VALUES (1)")
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_get_changes('probe', NULL, NULL, 'format-version', '2')"
        ).fetchall()
        assert any('"action":"I"' in r[0] for r in rows)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_process(
        [sys.executable, "-c", "from tributary.api.cli.main import main; main()", *args], what=f"tributary {args[:2]}"
    )


def test_pg_up_is_idempotent_and_down_stops(tmp_path: Path) -> None:
    data = str(tmp_path / "pg")
    first = _cli("pg", "up", "--data-dir", data)
    assert first.returncode == 0, first.stderr
    dsn = first.stdout.strip()
    assert dsn.startswith("postgresql://postgres@127.0.0.1:") and dsn.endswith("/tributary")
    try:
        again = _cli("pg", "up", "--data-dir", data)
        assert again.stdout.strip() == dsn
        assert _cli("pg", "dsn", "--data-dir", data).stdout.strip() == dsn
        with psycopg.connect(dsn) as conn:
            assert conn.execute("SHOW TimeZone").fetchone() == ("UTC",)
    finally:
        down = _cli("pg", "down", "--data-dir", data)
        assert down.returncode == 0
    missing = _cli("pg", "dsn", "--data-dir", data)
    assert missing.returncode == 1
    assert missing.stderr.strip().startswith("tributary: the embedded cluster") and "pg up" in missing.stderr
    EmbeddedPostgres(Path(data)).destroy()


def test_missing_wal2json_names_the_package(tmp_path: Path) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    # A pg_config that reports an empty library dir: as if wal2json were not installed.
    (fake_bin / "pg_config").write_text(f"#!/bin/sh\necho {tmp_path}\n")
    (fake_bin / "pg_config").chmod(0o755)
    cluster = EmbeddedPostgres(tmp_path / "pg", bin_dir=fake_bin)
    with pytest.raises(PgError, match=r"wal2json is not installed .*apt-get install postgresql-.*-wal2json"):
        cluster.check_wal2json()


def test_a_port_taken_between_choosing_and_binding_it_gives_way_to_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clusters started side by side (the test workers) may choose the same free port: the one
    that loses the race starts on another, instead of failing."""
    taken = listening_socket()  # held: the other process that won the port
    ports = iter([taken.getsockname()[1]])
    monkeypatch.setattr(embedded, "free_port", lambda preferred=0: next(ports, None) or free_port())
    cluster = EmbeddedPostgres(tmp_path / "pg")
    try:
        dsn = cluster.up()
        with psycopg.connect(dsn) as conn:
            port = conn.execute("SHOW port").fetchone()
        assert port is not None and int(port[0]) != taken.getsockname()[1]
    finally:
        taken.close()
        cluster.down()
        cluster.destroy()
