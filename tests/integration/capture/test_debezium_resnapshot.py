"""`envelope = "debezium"` and a re-snapshot (the slot lost, `snapshot = "when_needed"`): the key check
compares the table's keys with the topic's, which the log holds in Debezium's form (a schema, the
columns in primary-key order, Debezium's spelling of times); only the keys of rows deleted meanwhile
go, whichever snapshot method reads the table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import cli, records, write_config

pytestmark = pytest.mark.integration

TABLE = "CREATE TABLE mixed (t text, ts timestamptz, d date, v int NOT NULL, PRIMARY KEY (v, t, ts, d))"
FILL = (
    "INSERT INTO mixed SELECT 'k' || chr(34) || 'é' || (g % 7), timestamptz '2024-01-01 00:00:00.5+00' + g * interval "
    "'1 second', date '2024-01-01' + g, g FROM generate_series(1, 300) g"
)


def _live(log_root: Path) -> dict[bytes, dict[str, Any]]:
    """The topic folded by key, as a consumer would: each key's last change, tombstones removing it."""
    state: dict[bytes, dict[str, Any]] = {}
    for rec in records(log_root, "shop.public.mixed"):
        if rec.value is None:
            state.pop(rec.key, None)
            continue
        payload = orjson.loads(rec.value)["payload"]
        if payload["op"] == "d":
            state.pop(rec.key, None)
        elif payload["after"] is not None:
            state[rec.key] = payload["after"]
    return state


@pytest.mark.parametrize("method", ["consistent", "chunked"])
def test_a_resnapshot_under_the_debezium_envelope_deletes_only_the_rows_gone(
    fresh_db: str, tmp_path: Path, method: str
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(TABLE)
        conn.execute(FILL)
    log_root = tmp_path / "log"
    extra = f'snapshot = "when_needed"\nsnapshot_method = "{method}"\nsnapshot_chunk_rows = 100\nenvelope = "debezium"'
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=log_root, source_extra=extra)
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    assert len(_live(log_root)) == 300
    slot = next(line.split('"')[1] for line in config.read_text().splitlines() if line.startswith("slot ="))
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        conn.execute("DELETE FROM mixed WHERE v % 7 = 0")

    res = cli("capture", "--config", str(config), "--until-idle", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    assert "taking a new snapshot" in res.stderr
    live = _live(log_root)
    assert sorted(after["v"] for after in live.values()) == [v for v in range(1, 301) if v % 7 != 0]
    assert all(
        key.endswith(
            b'"payload":{"v":%d,"t":%b,"ts":%b,"d":%b}}'
            % (after["v"], orjson.dumps(after["t"]), orjson.dumps(after["ts"]), orjson.dumps(after["d"]))
        )
        for key, after in live.items()
    )
