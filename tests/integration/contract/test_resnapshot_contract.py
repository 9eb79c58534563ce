"""A re-snapshot after a lost or dropped slot (`snapshot = "when_needed"`), consistent or chunked, on
every log backend: every topic equals its table again, and the keys deleted while the slot was gone
get a delete + tombstone, exactly once, like a streamed delete (read back through the backend's
live keys: the local log's key scan, a read_committed scan of Kafka)."""

from __future__ import annotations

from pathlib import Path

import orjson
import psycopg
import pytest

from tests.backends import LogBackend, write_backend_config
from tests.integration.capture.helpers import cli
from tests.integration.capture.test_resnapshot import FILL, TABLES, _change_while_slot_gone, _compacted, _slot, _table
from tributary.log import Record

pytestmark = pytest.mark.integration

Position = tuple[str, int, int]


def _everything(backend: LogBackend, log_root: Path) -> dict[Position, Record]:
    """Every committed record of the tables' topics by (topic, partition, offset)."""
    topics = [f"shop.public.{t}" for t in TABLES]
    return {(t, r.partition, r.offset): r for t in topics for r in backend.records(log_root, t)}


def _deletes(records: dict[Position, Record], table_of: dict[str, str]) -> dict[tuple[str, bytes], int]:
    """How many deletes (op "d") each (topic, key) got, each checked to be Debezium-shaped and
    followed by its tombstone at the next offset (both are written one after the other)."""
    count: dict[tuple[str, bytes], int] = {}
    for (t, p, o), rec in records.items():
        if rec.value is None or b'"op":"d"' not in rec.value:
            continue
        value = orjson.loads(rec.value)
        assert rec.key is not None and value["after"] is None
        assert orjson.dumps(value["before"], option=orjson.OPT_SORT_KEYS) == rec.key
        assert value["source"]["snapshot"] in ("true", "last") and value["source"]["table"] == table_of[t]
        tomb = records.get((t, p, o + 1))
        assert tomb is not None and tomb.key == rec.key and tomb.value is None, "a delete is followed by its tombstone"
        key = (t, orjson.dumps(orjson.loads(rec.key), option=orjson.OPT_SORT_KEYS))
        count[key] = count.get(key, 0) + 1
    return count


def _capture_once(config: Path) -> str:
    """Run capture until idle; its stderr."""
    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    return res.stderr


@pytest.mark.parametrize("chunked", [False, True], ids=["consistent", "chunked"])
def test_a_resnapshot_deletes_the_rows_removed_meanwhile_exactly_once(
    fresh_db: str, tmp_path: Path, backend: LogBackend, chunked: bool
) -> None:
    table_of = {f"shop.public.{t}": t for t in TABLES}
    backend.prepare(*table_of)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for table, ddl in TABLES.items():
            conn.execute(ddl)
            conn.execute(FILL[table].format(n=1500))
    extra = 'snapshot = "when_needed"'
    if chunked:
        extra += '\nsnapshot_method = "chunked"\nsnapshot_chunk_rows = 400'
    log_root = tmp_path / "log"
    config = write_backend_config(backend, tmp_path / "t.toml", dsn=fresh_db, log_root=log_root, source_extra=extra)
    _capture_once(config)
    first = _everything(backend, log_root)
    assert not _deletes(first, table_of)
    before = {table: _compacted(config, f"shop.public.{table}") for table in TABLES}

    _change_while_slot_gone(fresh_db, config)
    assert "taking a new snapshot" in _capture_once(config)
    gone: set[tuple[str, bytes]] = set()
    for table in TABLES:
        now = _table(fresh_db, table)
        assert _compacted(config, f"shop.public.{table}") == now, table
        gone |= {(f"shop.public.{table}", key) for key in before[table].keys() - now.keys()}
    second = _everything(backend, log_root)
    deleted = _deletes(second, table_of)
    assert gone and set(deleted) == gone, "the rows removed meanwhile, and only those, are deleted"
    assert set(deleted.values()) == {1}, "each delete exactly once"
    fresh = [r.value for pos, r in second.items() if pos not in first and r.value and b'"op"' in r.value]
    markers = [orjson.loads(v)["source"]["snapshot"] for v in fresh]
    assert markers.count("last") == 1, "the re-snapshot's very last record is marked last"

    # Again, with nothing removed meanwhile: the tombstones dropped those keys, no delete repeats.
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (_slot(config),))
    assert "taking a new snapshot" in _capture_once(config)
    assert _deletes(_everything(backend, log_root), table_of) == deleted
    for table in TABLES:
        assert _compacted(config, f"shop.public.{table}") == _table(fresh_db, table), table
