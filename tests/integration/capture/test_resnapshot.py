"""A re-snapshot after a lost or dropped slot (`snapshot = "when_needed"`): a kill -9 in the middle
of it neither deletes a live key nor loses the re-snapshot (the local log). That it makes every
topic equal its table again, deleting exactly once the keys removed while the slot was gone, is
checked on every backend in tests/integration/contract/test_resnapshot_contract.py; the tables and
changes here are shared with it."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import capture_progress, cli, records, spawn_capture, wait_for, write_config
from tributary.capture.status import read_status

pytestmark = pytest.mark.integration

# One table per snapshot path (docs/capture.md): columnar, JSON from PostgreSQL, per value.
TABLES = {
    "items": "CREATE TABLE items (id int PRIMARY KEY, n numeric(12, 2), note text)",
    "docs": "CREATE TABLE docs (id int PRIMARY KEY, body jsonb)",
    "points": "CREATE TABLE points (a int, b text, x float8, PRIMARY KEY (a, b))",
}
FILL = {
    "items": "INSERT INTO items SELECT g, g * 1.5, 'seed' FROM generate_series(1, {n}) g",
    "docs": "INSERT INTO docs SELECT g, jsonb_build_object('v', g) FROM generate_series(1, {n}) g",
    # keys with a quote, a backslash and non-ASCII text: read back from the log as the same bytes
    "points": "INSERT INTO points SELECT g, 'k' || chr(34) || chr(92) || 'é✓' || g, g / 3.0 FROM generate_series(1, {n}) g",
}
KEYS = {"items": ("id",), "docs": ("id",), "points": ("a", "b")}


def _slot(config: Path) -> str:
    return next(line.split('"')[1] for line in config.read_text().splitlines() if line.startswith("slot ="))


def _when_needed(config: Path) -> None:
    config.write_text(
        config.read_text().replace('include = ["public.*"]', 'include = ["public.*"]\nsnapshot = "when_needed"')
    )


def _compacted(config: Path, topic: str) -> dict[bytes, dict[str, Any]]:
    """What `tributary log cat --compacted` shows of a CDC topic: {key: after}."""
    res = cli("log", "cat", "--compacted", topic, "--config", str(config))
    assert res.returncode == 0, res.stderr
    out = {}
    for line in res.stdout.splitlines():
        rec = orjson.loads(line)
        if rec["key"] is None or "op" not in (rec["value"] or {}):
            continue  # schema records
        out[orjson.dumps(rec["key"], option=orjson.OPT_SORT_KEYS)] = rec["value"]["after"]
    return out


def _table(dsn: str, table: str) -> dict[bytes, dict[str, Any]]:
    """The table as capture spells it: {canonical key: row} (row_to_json, floats as numbers)."""
    with psycopg.connect(dsn) as conn:
        rows = [r[0] for r in conn.execute(f"SELECT row_to_json(t) FROM {table} t").fetchall()]  # noqa: S608
    out = {}
    for row in rows:
        if "n" in row:
            row["n"] = f"{row['n']:.2f}"  # numeric: its exact text
        out[orjson.dumps({k: row[k] for k in KEYS[table]}, option=orjson.OPT_SORT_KEYS)] = row
    return out


def _change_while_slot_gone(dsn: str, config: Path) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (_slot(config),))
        conn.execute("DELETE FROM items WHERE id % 7 = 0")
        conn.execute("UPDATE items SET note = 'changed' WHERE id % 5 = 0")
        conn.execute("INSERT INTO items SELECT g, 0, 'new' FROM generate_series(1000001, 1000010) g")
        conn.execute("DELETE FROM docs WHERE id % 3 = 0")
        conn.execute('UPDATE docs SET body = \'{"v": "changed"}\' WHERE id % 4 = 0')
        conn.execute("DELETE FROM points WHERE a % 2 = 0")
        conn.execute("UPDATE points SET x = -1 WHERE a % 5 = 0")


def test_kill_9_in_the_middle_of_a_resnapshot(fresh_db: str, tmp_path: Path) -> None:
    rows = 400_000
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLES["items"])
        conn.execute(FILL["items"].format(n=rows))
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    _when_needed(config)
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    topic = "shop.public.items"
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (_slot(config),))
        conn.execute("DELETE FROM items WHERE id % 7 = 0")
        conn.execute("UPDATE items SET note = 'changed' WHERE id % 5 = 0")

    proc = spawn_capture(config)

    def mid_snapshot() -> bool:
        doc = read_status(tmp_path / "log") or {}
        src = (doc.get("sources") or [{}])[0]
        return src.get("state") == "snapshotting" and 0 < src.get("snapshot_rows_done", 0) < rows // 2

    try:
        wait_for(
            mid_snapshot,
            timeout=120,
            what="the re-snapshot under way",
            progress=lambda: capture_progress(tmp_path / "log"),
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    reads = sum(1 for r in records(tmp_path / "log", topic) if r.value and b'"op":"r"' in r.value)
    assert reads == rows, "nothing of the interrupted re-snapshot is visible"

    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    want = _table(fresh_db, "items")
    got = _compacted(config, topic)
    assert got.keys() == want.keys(), f"{len(got)} keys in the topic, {len(want)} in the table"
    assert got == want
    per_key: dict[bytes, list[str]] = {}
    for rec in records(tmp_path / "log", topic):
        if rec.value is not None and rec.key is not None and b'"op"' in rec.value:
            per_key.setdefault(rec.key, []).append(orjson.loads(rec.value)["op"])
    for key, ops in per_key.items():
        if key in want:
            assert ops == ["r", "r"], f"{key!r}: {ops} (each snapshot once, no delete)"
        else:
            assert ops == ["r", "d"], f"{key!r}: {ops}"
