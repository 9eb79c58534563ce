"""Schema changes under capture (#18 item 1), against a real server: an UPDATE's omitted column is
an unchanged TOAST value only if the column existed at that change and is TOAST-able; every change
of a table's columns yields a schema record before the first change of the new shape — while
capture runs and when it restarts after the DDL and reads changes from before and after it."""

from __future__ import annotations

import secrets
import signal
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import capture_progress, cli, records, spawn_capture, wait_for, write_config
from tributary.capture.database.catalog import CatalogConnection, ColumnHistory
from tributary.capture.decoding.values import UNAVAILABLE
from tributary.capture.records.schema_tracker import SCHEMA_KEY
from tributary.log.local import LogError

pytestmark = pytest.mark.integration

TOPIC = "shop.public.t"


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _config(dsn: str, tmp_path: Path) -> Path:
    config = write_config(tmp_path / "t.toml", dsn=dsn, log_root=tmp_path / "log", source_extra='snapshot = "never"')
    init = cli("init", "--config", str(config))
    assert init.returncode == 0, init.stdout + init.stderr
    return config


def _capture_until_idle(config: Path) -> None:
    run = cli("capture", "--config", str(config), "--until-idle", "1.5")
    assert run.returncode == 0, run.stderr


def _timelines(log: Path) -> dict[int, list[dict[str, Any]]]:
    """Each partition of the topic in log order: schema records as {"columns": [...]}, changes as they are."""
    out: dict[int, list[dict[str, Any]]] = {}
    try:
        found = records(log, TOPIC)
    except LogError:
        return out  # capture has not made its log yet
    for rec in found:
        if rec.value is None:
            continue
        value = orjson.loads(rec.value)
        if "schema" in value:
            out.setdefault(rec.partition, []).append({"columns": [c["name"] for c in value["schema"]["columns"]]})
        elif "op" in value:
            out.setdefault(rec.partition, []).append(value)
    return out


def _timeline(log: Path, key: int = 1) -> list[dict[str, Any]]:
    """The partition holding row `key`'s changes."""
    for timeline in _timelines(log).values():
        if any(
            e.get("after", e.get("before")) and (e["after"] or e["before"])["id"] == key for e in timeline if "op" in e
        ):
            return timeline
    return []


def _type_of(value: bytes | None, column: str) -> str:
    assert value is not None
    return next(c["type"] for c in orjson.loads(value)["schema"]["columns"] if c["name"] == column)


def _shape_before(timeline: list[dict[str, Any]], index: int) -> list[str]:
    """The columns of the last schema record before `timeline[index]`."""
    return next(e["columns"] for e in reversed(timeline[:index]) if "columns" in e)


def _check(timeline: list[dict[str, Any]]) -> None:
    """No placeholder for a column the change did not have; every change matches the shape announced before it."""
    assert timeline and "columns" in timeline[0], timeline[:1]
    for i, e in enumerate(timeline):
        if "op" in e and e["after"] is not None:
            assert UNAVAILABLE not in e["after"].values(), e["after"]
            assert sorted(e["after"]) == sorted(_shape_before(timeline, i)), (e["after"], _shape_before(timeline, i))


def test_drop_column_while_capture_runs(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, n int, note text)")
    config = _config(fresh_db, tmp_path)
    proc = spawn_capture(config)
    try:
        _sql(fresh_db, "INSERT INTO t VALUES (1, 1, 'a'), (2, 2, 'b')")
        wait_for(
            lambda: sum(map(len, _timelines(tmp_path / "log").values())) >= 2,
            what="the inserts",
            progress=lambda: capture_progress(tmp_path / "log"),
        )
        _sql(fresh_db, "ALTER TABLE t DROP COLUMN note", "UPDATE t SET n = 10 WHERE id = 1")
        _sql(fresh_db, "INSERT INTO t VALUES (3, 3)", "UPDATE t SET n = 20 WHERE id = 2")
        wait_for(
            lambda: sum("op" in e for t in _timelines(tmp_path / "log").values() for e in t) >= 5,
            what="the updates",
            progress=lambda: capture_progress(tmp_path / "log"),
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    for timeline in _timelines(tmp_path / "log").values():
        _check(timeline)
        assert [e["columns"] for e in timeline if "columns" in e] == [["id", "n", "note"], ["id", "n"]]
    for key, n in ((1, 10), (2, 20)):
        timeline = _timeline(tmp_path / "log", key)
        at = next(i for i, e in enumerate(timeline) if e.get("op") == "u" and e["after"]["id"] == key)
        assert timeline[at]["after"] == {"id": key, "n": n}
        assert _shape_before(timeline, at) == ["id", "n"]  # the drop is announced before the update


def test_restart_after_add_rename_and_retype_reads_changes_before_and_after(fresh_db: str, tmp_path: Path) -> None:
    big = secrets.token_hex(20_000)  # stored out of line: a later UPDATE omits it unchanged
    _sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, n int, note text, body text)")
    config = _config(fresh_db, tmp_path)
    _sql(fresh_db, f"INSERT INTO t VALUES (1, 1, 'a', '{big}')")
    _capture_until_idle(config)
    # Capture is stopped; the changes below are read after all the DDL happened.
    _sql(
        fresh_db,
        "UPDATE t SET n = 2 WHERE id = 1",  # before ADD COLUMN: no "big" at all; body unchanged TOAST
        "ALTER TABLE t ADD COLUMN big text",
        "UPDATE t SET n = 3, big = 'x' WHERE id = 1",
        "ALTER TABLE t RENAME COLUMN note TO remark",
        "UPDATE t SET n = 4 WHERE id = 1",
        "ALTER TABLE t ALTER COLUMN n TYPE bigint",
        "UPDATE t SET remark = 'r' WHERE id = 1",
        "ALTER TABLE t DROP COLUMN big",
        "UPDATE t SET n = 6 WHERE id = 1",
    )
    _capture_until_idle(config)
    timeline = _timeline(tmp_path / "log")
    updates = [e for e in timeline if e.get("op") == "u"]
    assert [u["after"] for u in updates] == [
        {"id": 1, "n": 2, "note": "a", "body": UNAVAILABLE},
        {"id": 1, "n": 3, "note": "a", "body": UNAVAILABLE, "big": "x"},
        {"id": 1, "n": 4, "remark": "a", "body": UNAVAILABLE, "big": "x"},
        {"id": 1, "n": 4, "remark": "r", "body": UNAVAILABLE, "big": "x"},
        {"id": 1, "n": 6, "remark": "r", "body": UNAVAILABLE},
    ]
    for i, e in enumerate(timeline):
        if e.get("op") == "u":
            assert sorted(e["after"]) == sorted(_shape_before(timeline, i)), (e["after"], _shape_before(timeline, i))
    # Read back after a rename, the order of a kept (omitted) column among renamed ones is a guess: sets.
    schemas = [sorted(e["columns"]) for e in timeline if "columns" in e]
    assert schemas[-4:] == [
        sorted(["id", "n", "note", "body", "big"]),
        sorted(["id", "n", "remark", "body", "big"]),
        sorted(["id", "n", "remark", "body", "big"]),  # n: integer → bigint
        sorted(["id", "n", "remark", "body"]),
    ]
    types = [e for e in records(tmp_path / "log", TOPIC) if e.partition == 0 and e.key == SCHEMA_KEY]
    assert [_type_of(r.value, "n") for r in types][-3:] == ["integer", "bigint", "bigint"]


def test_restart_after_a_column_is_altered_keeps_its_unchanged_toast(fresh_db: str, tmp_path: Path) -> None:
    """SET DEFAULT / SET NOT NULL rewrite a column's pg_attribute row after the changes read back:
    the column was there all along (a later column shows it), so no drop and re-add."""
    big = secrets.token_hex(20_000)
    _sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, n int, body text, tail int)")
    config = _config(fresh_db, tmp_path)
    _sql(fresh_db, f"INSERT INTO t VALUES (1, 1, '{big}', 0)")
    _capture_until_idle(config)
    _sql(
        fresh_db,
        "UPDATE t SET n = 2 WHERE id = 1",
        "ALTER TABLE t ALTER COLUMN body SET DEFAULT 'd'",
        "ALTER TABLE t ALTER COLUMN body SET NOT NULL",
        "UPDATE t SET n = 3 WHERE id = 1",
    )
    _capture_until_idle(config)
    timeline = _timeline(tmp_path / "log")
    assert [e["after"] for e in timeline if e.get("op") == "u"] == [
        {"id": 1, "n": n, "body": UNAVAILABLE, "tail": 0} for n in (2, 3)
    ]
    assert [e["columns"] for e in timeline if "columns" in e] == [["id", "n", "body", "tail"]] * 2  # one per run


def test_insert_templates_are_remade_after_each_change_of_shape(fresh_db: str, tmp_path: Path) -> None:
    """Held INSERTs take their table's template; a DDL between transactions changes the documents'
    shape: the template must not encode them, a schema record comes first, and the records equal
    the generic path's."""
    from tests.integration.capture.test_insert_templates import _capture, _documents, _slot

    _sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, n int, note text)")
    with _slot(fresh_db, "shape"):
        batches = [
            ("", "INSERT INTO t SELECT g, g, 'a' FROM generate_series({lo}, {hi}) g"),
            (
                "ALTER TABLE t ADD COLUMN extra text",
                "INSERT INTO t SELECT g, g, 'b', 'x' FROM generate_series({lo}, {hi}) g",
            ),
            (
                "ALTER TABLE t RENAME COLUMN note TO remark",
                "INSERT INTO t SELECT g, g, 'c', 'y' FROM generate_series({lo}, {hi}) g",
            ),
            (
                "ALTER TABLE t ALTER COLUMN n TYPE bigint",
                "INSERT INTO t SELECT g, g, 'd', 'z' FROM generate_series({lo}, {hi}) g",
            ),
            ("ALTER TABLE t DROP COLUMN remark", "INSERT INTO t SELECT g, g, 'w' FROM generate_series({lo}, {hi}) g"),
        ]
        for i, (ddl, insert) in enumerate(batches):
            if ddl:
                _sql(fresh_db, ddl)
            _sql(fresh_db, insert.format(lo=i * 500 + 1, hi=i * 500 + 500))
        docs = _documents(fresh_db, "shape")
    templated, n = _capture(fresh_db, docs, tmp_path / "tpl", templates=True)
    generic, _ = _capture(fresh_db, docs, tmp_path / "generic", templates=False)
    assert n > 0
    assert templated == generic
    schemas = []
    for topic, partition, *_, value, _headers in templated:
        if topic != TOPIC or partition != 0 or value is None:
            continue
        doc = orjson.loads(value)
        if "schema" in doc:
            schemas.append([(c["name"], c["type"]) for c in doc["schema"]["columns"]])
        elif "op" in doc:
            assert [c[0] for c in schemas[-1]] == list(doc["after"]), doc["after"]
    assert [[name for name, _ in s] for s in schemas] == [
        ["id", "n", "note"],
        ["id", "n", "note", "extra"],
        ["id", "n", "remark", "extra"],
        ["id", "n", "remark", "extra"],
        ["id", "n", "extra"],
    ]
    assert schemas[3][1] == ("n", "bigint")


def test_column_history_places_each_transaction_before_or_after_the_ddl(fresh_db: str) -> None:
    def xid_of(conn: psycopg.Connection[Any], statement: str) -> int:
        with conn.transaction():
            conn.execute(statement)
            row = conn.execute("SELECT txid_current() % 4294967296").fetchone()
        assert row is not None
        return int(row[0])

    _sql(fresh_db, "CREATE TABLE t (id int PRIMARY KEY, note text)", "INSERT INTO t VALUES (1, 'a')")
    history = ColumnHistory(CatalogConnection(lambda: psycopg.connect(fresh_db, autocommit=True)))
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        before_add = xid_of(conn, "UPDATE t SET id = 1")
        conn.execute("ALTER TABLE t ADD COLUMN big text")
        after_add = xid_of(conn, "UPDATE t SET id = 1")
        assert not history.existed("public", "t", "big", before_add)
        assert history.existed("public", "t", "big", after_add)
        assert history.existed("public", "t", "note", before_add)
        assert history.reads == 1  # both transactions had ended when the catalog was read
        conn.execute("ALTER TABLE t DROP COLUMN note")
        after_drop = xid_of(conn, "UPDATE t SET id = 1")
        assert not history.existed("public", "t", "note", after_drop)
        assert history.reads == 2  # a transaction the first reading could not have seen
        assert history.existed("public", "t", "note", after_add)  # dropped only after it
        assert not history.existed("public", "t", "nothing", after_add)
        assert history.reads == 2
    history.close()
