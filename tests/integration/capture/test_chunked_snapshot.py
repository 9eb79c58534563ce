"""Chunked snapshots beside streaming (capture/chunked.py): chunk rows equal a consistent
snapshot's, a streamed change inside a chunk's window wins over the chunk row, a kill -9 resumes
from the last committed chunk, the other sources keep streaming, a widened `include` is
snapshotted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import cli, records, write_config
from tests.integration.capture.test_resnapshot import FILL, TABLES, _compacted, _table
from tributary.capture.status import read_status

pytestmark = pytest.mark.integration


def _chunked(config: Path, rows: int, extra: str = "") -> Path:
    text = config.read_text().replace(
        'include = ["public.*"]',
        f'include = ["public.*"]\nsnapshot_method = "chunked"\nsnapshot_chunk_rows = {rows}\n{extra}',
    )
    config.write_text(text)
    return config


def _without_position(value: dict[str, Any]) -> dict[str, Any]:
    """A snapshot record minus what says when and where it was read."""
    out = dict(value)
    out.pop("ts_ms", None)
    source = dict(out.pop("source"))
    for field in ("lsn", "ts_ms", "snapshot"):
        source.pop(field, None)
    out["source"] = source
    return out


def _by_key(log_root: Path, topic: str) -> dict[bytes, tuple[int, bytes]]:
    """Each key's snapshot record (its partition and value bytes)."""
    return {r.key: (r.partition, r.value) for r in records(log_root, topic) if r.value and b'"op":"r"' in r.value}


def test_chunked_records_equal_the_consistent_snapshots(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for table, ddl in TABLES.items():
            conn.execute(ddl)
            conn.execute(FILL[table].format(n=2500))
    consistent = write_config(tmp_path / "c.toml", dsn=fresh_db, log_root=tmp_path / "c", name="shop")
    chunked = _chunked(write_config(tmp_path / "k.toml", dsn=fresh_db, log_root=tmp_path / "k", name="shop"), 700)
    for config in (consistent, chunked):
        res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
        assert res.returncode == 0, res.stderr
    markers = []
    for table in TABLES:
        topic = f"shop.public.{table}"
        want = _by_key(tmp_path / "c", topic)
        got = _by_key(tmp_path / "k", topic)
        assert len(want) == 2500 and got.keys() == want.keys(), table
        for key, (partition, value) in got.items():
            assert partition == want[key][0], "same partition"
            assert _without_position(orjson.loads(value)) == _without_position(orjson.loads(want[key][1])), table
        markers += [orjson.loads(v)["source"]["snapshot"] for _, v in got.values()]
        assert _compacted(chunked, topic) == _table(fresh_db, table)
    assert markers.count("last") == 1
    status = read_status(tmp_path / "k")
    assert status is not None
    source = status["sources"][0]
    assert source["snapshot_tables_pending"] == [] and source["snapshot_rows_read"] == 3 * 2500
