"""The re-snapshot's check of a topic's keys against its table (capture/snapshot/chunked.py): composite
keys of mixed types match their rows, each key is found through the table's key index (not a
scan of the table per key), a whole-row key with NULLs still matches its row, and a re-snapshot
begun in this process deletes without querying the table."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.integration.capture.helpers import cli, confirmed_past, status_progress, wait_for, wal_position, write_config
from tests.integration.capture.test_chunked_snapshot import _chunked, _drop_slots, _spec
from tests.integration.capture.test_resnapshot import FILL, TABLES, _compacted, _slot, _table, _when_needed
from tributary.capture.daemon import CaptureDaemon, DaemonOptions
from tributary.capture.database.catalog import TableInfo, list_tables
from tributary.capture.snapshot import chunked
from tributary.capture.snapshot.chunked import ChunkedSnapshot, check_query, key_lines

pytestmark = pytest.mark.integration

MIXED = (
    "CREATE TABLE mixed (t text, u uuid, n numeric(12, 3), ts timestamptz, b bytea, v int NOT NULL, "
    "PRIMARY KEY (t, u, n, ts, b))"
)
# text with a quote, a backslash and non-ASCII; numerics with trailing zeros; bytea
FILL_MIXED = (
    "INSERT INTO mixed SELECT 'k' || chr(34) || chr(92) || 'é' || (g % 7), md5(g::text)::uuid, (g % 5) * 1.5, "
    "timestamptz '2024-01-01 00:00:00.123456+00' + g * interval '1 second', decode(lpad(to_hex(g % 3), 2, '0'), 'hex'), g "
    "FROM generate_series(1, {n}) g"
)


def _mixed_info(conn: psycopg.Connection[Any]) -> TableInfo:
    return list_tables(conn, lambda s, t: (s, t) == ("public", "mixed"))[0]


def _keys(config: Path) -> dict[bytes, int]:
    """The topic's live keys, each with its row's `v`."""
    return {k: int(after["v"]) for k, after in _compacted(config, "shop.public.mixed").items()}


def test_a_chunked_resnapshot_checks_composite_keys_of_mixed_types(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(MIXED)
        conn.execute(FILL_MIXED.format(n=1200))
    config = _chunked(write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log"), 300)
    config.write_text(
        config.read_text().replace('include = ["public.*"]', 'include = ["public.*"]\nsnapshot = "when_needed"')
    )
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    before = _keys(config)
    assert len(before) == 1200
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (_slot(config),))
        conn.execute("DELETE FROM mixed WHERE v % 7 = 0")

    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert "taking a new snapshot" in res.stderr
    after = _keys(config)
    want = {k: v for k, v in before.items() if v % 7 != 0}
    assert after.keys() == want.keys(), f"{len(after)} keys in the topic, {len(want)} rows in the table"


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes += _plan_nodes(child)
    return nodes


def _per_key_scans(plan: dict[str, Any], table: str) -> list[dict[str, Any]]:
    """The sequential scans of `table` on the inner side of a nested loop: run (or re-read from
    a Materialize) once per key of the batch."""
    found = []
    for node in _plan_nodes(plan):
        if node["Node Type"] == "Nested Loop":
            inner = node["Plans"][1]
            found += [n for n in _plan_nodes(inner) if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == table]
    return found


def _lines(batch: list[str]) -> str:
    return key_lines([k.encode() for k in batch])


def _explain(conn: psycopg.Connection[Any], query: sql.Composed, batch: list[str]) -> dict[str, Any]:
    row = conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + query, (_lines(batch),)).fetchone()
    assert row is not None
    return dict(row[0][0]["Plan"])


def test_the_key_check_never_scans_the_table_per_key(fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(MIXED)
        conn.execute(FILL_MIXED.format(n=50_000))
        conn.execute("ANALYZE mixed")
        info = _mixed_info(conn)
        # a batch as the check reads it: the keys' JSON, as capture spells them
        batch = [
            str(r[0])
            for r in conn.execute(
                "SELECT json_build_object('t', t, 'u', u, 'n', n::text, 'ts', ts, 'b', encode(b, 'hex'))::text "
                "FROM mixed WHERE v % 20 = 0 ORDER BY v LIMIT 2000"
            )
        ]
        batch += [k.replace('"k', '"gone', 1) for k in batch[:20]]
        query = check_query(conn, info)
        absent = [r[0] for r in conn.execute(query, (_lines(batch),))]
        plans = {n: _explain(conn, query, batch[-n:]) for n in (len(batch), 40)}
    assert sorted(absent) == sorted(batch[-20:]), "exactly the keys the table does not have"
    for n, plan in plans.items():
        assert not _per_key_scans(plan, "mixed"), f"a batch of {n} keys scans the table once per key: {plan}"
    # a small batch: each key looked up in the key's index
    scans = [n for n in _plan_nodes(plans[40]) if n.get("Relation Name") == "mixed"]
    assert scans and all(n.get("Index Name") == "mixed_pkey" for n in scans), plans[40]


def test_a_whole_row_key_matches_rows_with_nulls(fresh_db: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE loose (a int, b text, c bytea)")
        conn.execute("ALTER TABLE loose REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO loose VALUES (1, NULL, NULL), (2, 'x', '\\x0a'), (NULL, 'y', NULL)")
        columns = list_tables(conn, lambda s, t: t == "loose")[0].columns
        # the whole row as the key: every column, none NOT NULL
        info = TableInfo("public", "loose", columns, (), "f", tuple(c.name for c in columns), 3)
        keys = {
            '{"a":1,"b":null,"c":null}': False,
            '{"a":2,"b":"x","c":"0a"}': False,
            '{"a":null,"b":"y","c":null}': False,
            '{"a":1,"b":"x","c":null}': True,
            '{"a":2,"b":"x","c":null}': True,
            '{"a":null,"b":null,"c":null}': True,
        }
        query = check_query(conn, info)
        absent = {r[0] for r in conn.execute(query, (_lines(list(keys)),))}
    assert absent == {k for k, gone in keys.items() if gone}
    assert "IS NOT DISTINCT FROM" in query.as_string(None)


def test_a_resnapshot_begun_in_this_process_deletes_without_querying_the_table(
    fresh_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-snapshot that this process began at its first chunk kept every key staged to the
    topic since (chunks and stream): its check deletes the live keys outside them, with no query
    of the table, and stays right while rows are inserted, updated and deleted during its chunks
    and during the check itself."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=2000))
    config = _chunked(write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log"), 300)
    _when_needed(config)
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (_slot(config),))
        conn.execute("DELETE FROM items WHERE id % 7 = 0")  # gone while no slot: only the check finds them

    phases: list[str] = []

    def change_meanwhile(table: str, phase: str) -> None:
        phases.append(phase)
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            if phases.count("rows") == 1 and phase == "rows":  # inside the first chunk's window
                conn.execute("DELETE FROM items WHERE id IN (5, 1990)")  # one read, one not yet
                conn.execute("UPDATE items SET note = 'during' WHERE id IN (6, 1991)")
                conn.execute("INSERT INTO items SELECT g, 1, 'new' FROM generate_series(3001, 3010) g")
            elif phase == "absent" and phases.count("absent") == 1:  # inside the check's window
                conn.execute("DELETE FROM items WHERE id IN (8, 3001)")
                conn.execute("INSERT INTO items VALUES (7, 2, 'back')")  # its key was deleted while no slot

    queried: list[str] = []
    original = chunked.check_query

    def counted(conn: psycopg.Connection[Any], info: TableInfo) -> sql.Composed:
        queried.append(info.qualified)
        return original(conn, info)

    monkeypatch.setattr(chunked, "check_query", counted)
    monkeypatch.setattr(ChunkedSnapshot, "after_read", change_meanwhile)
    spec = _spec("shop", fresh_db, slot=_slot(config), snapshot="when_needed", snapshot_chunk_rows=300)
    daemon = CaptureDaemon([spec], DaemonOptions(log_root=tmp_path / "log", default_partitions=3))
    runner = threading.Thread(target=daemon.run)
    runner.start()
    try:
        session = daemon.sessions[0]
        moving = status_progress(tmp_path / "log", session.status)
        wait_for(lambda: "absent" in phases and not session.snapshotting, what="the re-snapshot's end", progress=moving)
        end = wal_position(fresh_db)
        wait_for(lambda: confirmed_past(session.status, end), what="the stream past the changes", progress=moving)
    finally:
        daemon.request_stop()
        runner.join(timeout=60)
        _drop_slots(fresh_db, spec)
    assert queried == []  # the check queried nothing
    assert _compacted(config, "shop.public.items") == _table(fresh_db, "items")
