"""The eight wal2json traps (docs/design.md, "Capture"), each against a real server,
plus every value type round-tripping exactly and snapshot rows equal to streamed rows."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.integration.capture.helpers import changes, cli, records, write_config
from tributary.capture.decoding.values import UNAVAILABLE

pytestmark = pytest.mark.integration


def _sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def _stream(
    dsn: str, tmp_path: Path, *statements: str, snapshot: str = "never", init_args: tuple[str, ...] = ()
) -> Path:
    """init (creates the slot), run `statements`, then capture until idle; returns the log root."""
    config = write_config(
        tmp_path / "t.toml", dsn=dsn, log_root=tmp_path / "log", source_extra=f'snapshot = "{snapshot}"'
    )
    init = cli("init", "--config", str(config), *init_args)
    assert init.returncode == 0, init.stdout + init.stderr
    _sql(dsn, *statements)
    run = cli("capture", "--config", str(config), "--until-idle", "1.5")
    assert run.returncode == 0, run.stderr
    return tmp_path / "log"


def _ops(log: Path, topic: str) -> list[dict[str, Any]]:
    return changes(log, topic)


def test_trap1_numeric_keeps_every_digit_and_nan_is_documented_null(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, "CREATE TABLE n (id int PRIMARY KEY, v numeric, f float8)")
    log = _stream(
        fresh_db,
        tmp_path,
        "INSERT INTO n VALUES (1, 12345678901234567890.1234567890, 0.1)",
        "INSERT INTO n VALUES (2, 'NaN', 'NaN')",
        "INSERT INTO n VALUES (3, -0.000000000000000000000000000001, 1e308)",
    )
    rows = {c["after"]["id"]: c["after"] for c in _ops(log, "shop.public.n")}
    assert rows[1]["v"] == "12345678901234567890.1234567890"
    assert rows[3]["v"] == "-0.000000000000000000000000000001"
    assert rows[1]["f"] == 0.1 and rows[3]["f"] == 1e308
    assert rows[2]["v"] is None and rows[2]["f"] is None  # wal2json 2.5 sends NaN as null
    status = (tmp_path / "log" / "capture-status.json").read_text()
    assert "NaN" in status and "public.n" in status  # …and the user is told so


def test_trap2_timestamps_are_utc_whatever_the_server_timezone(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, "CREATE TABLE ts (id int PRIMARY KEY, at timestamptz, local timestamp, d date, t time, i interval)")
    dbname = fresh_db.rsplit("/", 1)[1]
    _sql(fresh_db, f"ALTER DATABASE \"{dbname}\" SET TimeZone = 'America/New_York'")
    log = _stream(
        fresh_db,
        tmp_path,
        "INSERT INTO ts VALUES (1, '2024-01-02 03:04:05.123456+00', '2024-01-02 03:04:05', '2024-02-29', '13:14:15', '1 day 02:03:04')",
    )
    after = _ops(log, "shop.public.ts")[0]["after"]
    assert after == {
        "id": 1,
        "at": "2024-01-02T03:04:05.123456Z",
        "local": "2024-01-02T03:04:05",
        "d": "2024-02-29",
        "t": "13:14:15",
        "i": "1 day 02:03:04",
    }


def test_trap3_unchanged_toast_is_marked_or_filled_never_null(fresh_db: str, tmp_path: Path) -> None:
    big = secrets.token_hex(20_000)  # incompressible, > 8 kB: stored out of line
    _sql(
        fresh_db,
        "CREATE TABLE d (id int PRIMARY KEY, note text, big text)",
        "CREATE TABLE f (id int PRIMARY KEY, note text, big text)",
        "ALTER TABLE f REPLICA IDENTITY FULL",
    )
    log = _stream(
        fresh_db,
        tmp_path,
        f"INSERT INTO d VALUES (1, 'a', '{big}')",
        f"INSERT INTO f VALUES (1, 'a', '{big}')",
        "UPDATE d SET note = 'b' WHERE id = 1",
        "UPDATE f SET note = 'b' WHERE id = 1",
    )
    upd_default = [c for c in _ops(log, "shop.public.d") if c["op"] == "u"][0]
    upd_full = [c for c in _ops(log, "shop.public.f") if c["op"] == "u"][0]
    assert upd_default["after"] == {"id": 1, "note": "b", "big": UNAVAILABLE}
    assert upd_full["after"] == {"id": 1, "note": "b", "big": big}
    assert upd_full["before"]["note"] == "a"


def test_trap4_table_without_key_is_refused_by_name_then_fixed(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, "CREATE TABLE nokey (a int, b text)", "CREATE TABLE ok (id int PRIMARY KEY)")
    config = write_config(
        tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log", source_extra='snapshot = "never"'
    )
    refused = cli("init", "--config", str(config))
    assert refused.returncode == 1
    assert "public.nokey" in refused.stdout and "silently lost" in refused.stdout
    assert refused.stderr.strip().startswith("tributary: init: source(s) shop cannot be captured")
    allowed = cli("init", "--config", str(config), "--allow-without-key", "public.nokey")
    assert allowed.returncode == 0, allowed.stdout
    fixed = cli("init", "--config", str(config), "--replica-identity-full")
    assert fixed.returncode == 0 and "REPLICA IDENTITY FULL" in fixed.stdout
    _sql(fresh_db, "INSERT INTO nokey VALUES (1, 'x')", "UPDATE nokey SET b = 'y'", "DELETE FROM nokey")
    assert cli("capture", "--config", str(config), "--until-idle", "1.5").returncode == 0
    ops = [c["op"] for c in _ops(tmp_path / "log", "shop.public.nokey")]
    # With FULL identity nothing is lost; keyed by the whole row, the UPDATE moves the key.
    assert ops == ["c", "d", "c", "d"]


def test_trap5_ddl_mid_stream_emits_schema_records(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, "CREATE TABLE s (id int PRIMARY KEY, a text)")
    log = _stream(
        fresh_db,
        tmp_path,
        "INSERT INTO s VALUES (1, 'x')",
        "ALTER TABLE s ADD COLUMN b numeric(10, 2) DEFAULT 1.50",
        "INSERT INTO s VALUES (2, 'y', 2.25)",
        "ALTER TABLE s DROP COLUMN a",
        "INSERT INTO s VALUES (3, 3)",
    )
    import orjson

    schemas = [
        orjson.loads(r.value)["schema"]
        for r in records(log, "shop.public.s")
        if r.value and r.partition == 0 and b'"schema":{' in r.value
    ]
    assert [[c["name"] for c in s["columns"]] for s in schemas] == [["id", "a"], ["id", "a", "b"], ["id", "b"]]
    assert schemas[1]["columns"][2]["type"] == "numeric(10,2)"
    rows = {c["after"]["id"]: c["after"] for c in _ops(log, "shop.public.s")}
    assert rows == {1: {"id": 1, "a": "x"}, 2: {"id": 2, "a": "y", "b": "2.25"}, 3: {"id": 3, "b": "3.00"}}


def test_trap6_jsonb_bytea_arrays_uuid_and_null_round_trip(fresh_db: str, tmp_path: Path) -> None:
    _sql(
        fresh_db,
        "CREATE TABLE v (id int PRIMARY KEY, j jsonb, js json, b bytea, ia int[], ta text[], u uuid, ok bool, n text)",
    )
    log = _stream(
        fresh_db,
        tmp_path,
        """INSERT INTO v VALUES (1, '{"k": [1, 2.50, "x"], "deep": {"n": 12345678901234567890.5}}', '{"a":1}',
                     '\\xdeadbeef', '{1,NULL,3}', '{"a b","q\\"x",NULL,"{}"}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', true, NULL)""",
    )
    after = _ops(log, "shop.public.v")[0]["after"]
    assert after["j"] == {"k": [1, 2.5, "x"], "deep": {"n": 12345678901234567890.5}}
    raw = next(r.value for r in records(log, "shop.public.v") if r.value and b'"op":"c"' in r.value)
    assert b"12345678901234567890.5" in raw  # embedded verbatim, digits intact
    assert after["js"] == {"a": 1}
    assert after["b"] == "deadbeef"
    assert after["ia"] == [1, None, 3]
    assert after["ta"] == ["a b", 'q"x', None, "{}"]
    assert after["u"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert after["ok"] is True and after["n"] is None


def test_trap8_primary_key_change_is_delete_tombstone_create(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, "CREATE TABLE k (id int PRIMARY KEY, v text)")
    log = _stream(fresh_db, tmp_path, "INSERT INTO k VALUES (1, 'a')", "UPDATE k SET id = 2 WHERE id = 1")
    recs = [r for r in records(log, "shop.public.k") if b"__schema__" not in (r.key or b"")]
    by_key: dict[bytes, list[Any]] = {}
    for r in recs:
        by_key.setdefault(r.key, []).append(r)
    import orjson

    old = by_key[b'{"id":1}']
    assert [orjson.loads(r.value)["op"] if r.value else None for r in old] == ["c", "d", None]
    new = by_key[b'{"id":2}']
    assert [orjson.loads(r.value)["op"] for r in new] == ["c"]
    assert orjson.loads(new[0].value)["after"] == {"id": 2, "v": "a"}


def test_snapshot_rows_equal_streamed_rows_byte_for_byte(fresh_db: str, tmp_path: Path) -> None:
    values = (
        "12345678901234567890.1234567890, '2024-01-02 03:04:05.5+00', '{\"a\": [1, 2.0]}', "
        "'\\x00ff', '{1,2}', '{\"x y\",z}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', false, 'P1DT2H', 1.25::float8"
    )
    _sql(
        fresh_db,
        "CREATE TABLE eq (id int PRIMARY KEY, n numeric, at timestamptz, j jsonb, b bytea, ia int[], ta text[], "
        "u uuid, ok bool, i interval, f float8)",
        f"INSERT INTO eq VALUES (1, {values})",
    )
    log = _stream(fresh_db, tmp_path, snapshot="initial")  # row 1 by the snapshot
    _sql(fresh_db, f"INSERT INTO eq VALUES (2, {values})")  # row 2 by the stream
    assert cli("capture", "--config", str(tmp_path / "t.toml"), "--until-idle", "1.5").returncode == 0
    import orjson

    rows = {}
    for r in records(log, "shop.public.eq"):
        if r.value and b'"after"' in r.value:
            env = orjson.loads(r.value)
            rows[env["op"]] = r.value[r.value.index(b'"after":') : r.value.index(b',"source"')]
    assert set(rows) == {"r", "c"}
    assert rows["r"].replace(b'"id":1', b'"id":2') == rows["c"]


def test_logical_messages_go_to_the_messages_topic(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, "CREATE TABLE m (id int PRIMARY KEY)")
    log = _stream(
        fresh_db,
        tmp_path,
        "SELECT pg_logical_emit_message(true, 'audit', 'tx message')",
        "SELECT pg_logical_emit_message(false, 'audit', 'loose message')",
    )
    import orjson

    msgs = [orjson.loads(r.value) for r in records(log, "shop.messages")]
    assert sorted(m["content"] for m in msgs) == ["loose message", "tx message"]
    assert all(m["prefix"] == "audit" and m["op"] == "m" for m in msgs)


def test_truncate_reaches_every_partition(fresh_db: str, tmp_path: Path) -> None:
    _sql(fresh_db, "CREATE TABLE tr (id int PRIMARY KEY)")
    log = _stream(fresh_db, tmp_path, "INSERT INTO tr SELECT generate_series(1, 20)", "TRUNCATE tr")
    import orjson

    truncs = [r.partition for r in records(log, "shop.public.tr") if r.value and orjson.loads(r.value).get("op") == "t"]
    assert sorted(truncs) == [0, 1, 2]


def test_bad_environments_each_give_one_clear_line(fresh_db: str, tmp_path: Path) -> None:
    unreachable = write_config(
        tmp_path / "a.toml", dsn="postgresql://postgres@127.0.0.1:1/nope", log_root=tmp_path / "l1"
    )
    # A failing source is retried (its failure logged once, one line) while the others go on; a
    # run with --until-idle that ends with it still failing exits 1 with one line saying why.
    res = cli("capture", "--config", str(unreachable), "--until-idle", "1")
    assert res.returncode == 1
    *logged, last = res.stderr.strip().splitlines()
    assert last.startswith("tributary: source 'shop': ") and "Connection refused" in last
    assert len(logged) == 1 and "WARNING" in logged[0] and "source 'shop'" in logged[0]
    missing_db = write_config(tmp_path / "b.toml", dsn=fresh_db + "_missing", log_root=tmp_path / "l2")
    res = cli("capture", "--config", str(missing_db), "--until-idle", "1")
    *logged, last = res.stderr.strip().splitlines()
    assert res.returncode == 1 and last.startswith("tributary: source 'shop': ") and "does not exist" in last
    assert len(logged) == 1 and "Traceback" not in res.stderr
    bad = tmp_path / "c.toml"
    bad.write_text('[log]\npartitions = "many"\n')
    res = cli("capture", "--config", str(bad))
    assert res.returncode == 1 and "[log] partitions: expected an integer, got 'many'" in res.stderr
