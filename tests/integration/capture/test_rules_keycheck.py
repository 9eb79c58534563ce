"""A chunked re-snapshot's key check (capture/snapshot/chunked.py) of a table with rules, when it
queries the table (a re-snapshot resumed by another process): keys hashed by a rule still match
their rows, and the keys of rows now outside the row filter are deleted like rows that are gone."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from tests.integration.capture.helpers import cli, confirmed_past, status_progress, wait_for, wal_position, write_config
from tests.integration.capture.test_chunked_snapshot import _chunked, _drop_slots
from tests.integration.capture.test_resnapshot import _compacted, _slot, _when_needed
from tests.integration.contract.test_rules_contract import SALT, _hash
from tributary.api.settings.config import load_settings
from tributary.api.settings.sources import source_specs
from tributary.capture.daemon import CaptureDaemon, DaemonOptions
from tributary.capture.snapshot.chunked import ChunkedSnapshot

pytestmark = pytest.mark.integration

RULES = f"""
[[sources.rules]]
tables = ["public.accounts"]
hash = ["acct"]
hash_salt = "{SALT}"
row_filter = "tier >= 2"
"""


def test_a_resumed_key_check_matches_hashed_keys_and_drops_rows_out_of_the_filter(
    fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (acct text PRIMARY KEY, tier int)")
        conn.execute("INSERT INTO accounts SELECT 'ACCT-' || g, g % 4 FROM generate_series(1, 900) g")
    config = _chunked(write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", extra=RULES), 200)
    _when_needed(config)
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (_slot(config),))
        conn.execute("DELETE FROM accounts WHERE acct IN ('ACCT-2', 'ACCT-3')")  # gone
        conn.execute("UPDATE accounts SET tier = 0 WHERE acct IN ('ACCT-6', 'ACCT-7')")  # out of the filter

    # As if another process had begun the re-snapshot: its check queries the table.
    keep_keys = ChunkedSnapshot._keep_keys

    def resumed(self: ChunkedSnapshot, name: str, topic: str) -> bool:
        self._unkept.add(name)
        return keep_keys(self, name, topic)

    phases: list[str] = []
    monkeypatch.setattr(ChunkedSnapshot, "_keep_keys", resumed)
    monkeypatch.setattr(ChunkedSnapshot, "after_read", lambda table, phase: phases.append(phase))
    spec = source_specs(load_settings(config))[0]
    daemon = CaptureDaemon([spec], DaemonOptions(log_root=tmp_path / "log", default_partitions=3))
    runner = threading.Thread(target=daemon.run)
    runner.start()
    try:
        session = daemon.sessions[0]
        moving = status_progress(tmp_path / "log", session.status)
        wait_for(lambda: "absent" in phases and not session.snapshotting, what="the re-snapshot's end", progress=moving)
        end = wal_position(fresh_db)
        wait_for(lambda: confirmed_past(session.status, end), what="the stream past the re-snapshot", progress=moving)
    finally:
        daemon.request_stop()
        runner.join(timeout=60)
        _drop_slots(fresh_db, spec)
    with psycopg.connect(fresh_db) as conn:
        rows = conn.execute("SELECT acct, tier FROM accounts WHERE tier >= 2").fetchall()
    want = {f'{{"acct":"{_hash(a)}"}}'.encode(): {"acct": _hash(a), "tier": t} for a, t in rows}
    assert _compacted(config, "shop.public.accounts") == want


def test_a_rule_excluding_a_key_column_stops_capture_in_one_line(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (acct text PRIMARY KEY, secret text)")
        conn.execute("INSERT INTO accounts VALUES ('ACCT-1', 'SECRET-VALUE')")
    rules = '[[sources.rules]]\ntables = ["public.accounts"]\nexclude = ["acct", "secret"]\n'
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", extra=rules)
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode != 0
    line = "[[sources.rules]] exclude names key column 'acct' of public.accounts"
    assert line in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert "SECRET-VALUE" not in res.stderr + res.stdout
