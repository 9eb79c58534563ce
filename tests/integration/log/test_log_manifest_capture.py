"""A real capture run over a log whose manifest.json was deleted: capture refuses (it used to
overwrite the segments with a new snapshot), `log verify --repair` rebuilds the manifest with the
source's position, and capture resumes the slot with offsets continuing and nothing twice."""

from __future__ import annotations

from pathlib import Path

import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import cli, records, table_state, write_config
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.status import read_status
from tributary.log.local import Log

pytestmark = pytest.mark.integration


def _segments(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*.log"))}


@pytest.mark.parametrize("status_file", ["kept", "lost"])  # positions from the status file, or from records alone
def test_capture_refuses_then_resumes_after_repair(fresh_db: str, tmp_path: Path, status_file: str) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'a' FROM generate_series(1, 100) g")
    root = tmp_path / "log"
    config = write_config(tmp_path / "t.toml", dsn=fresh_db, log_root=root)
    first = cli("capture", "--config", str(config), "--until-idle", "1.5")
    assert first.returncode == 0, first.stderr
    with psycopg.connect(fresh_db, autocommit=True) as conn:  # while capture is stopped
        conn.execute("UPDATE t SET v = 'b' WHERE id <= 10")
    before = records(root, "shop.public.t")
    with Log.open(root) as log:
        ends, position = log.end_offsets("shop.public.t"), log.positions()["shop"]
    segments = _segments(root)
    # Idle, capture confirms the server's position to the slot (nothing of ours lies between), so the
    # status file's confirmed LSN may be past the manifest's: resuming from either is safe.
    confirmed = max(Lsn.parse(s["confirmed_lsn"]) for s in read_status(root)["sources"] if s["name"] == "shop")
    safe = max(Lsn.parse(position), confirmed) if status_file == "kept" else Lsn.parse(position)

    (root / "manifest.json").unlink()
    if status_file == "lost":
        (root / "capture-status.json").unlink()
    refused = cli("capture", "--config", str(config), "--until-idle", "1.5")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        f"tributary: the log at {root} has segment files but no manifest.json, so it is not empty; "
        f"run `tributary log verify --repair --root {root}` to rebuild it from the segments"
    )
    assert _segments(root) == segments  # nothing cut, nothing overwritten

    repaired = cli("log", "verify", "--repair", "--root", str(root))
    assert repaired.returncode == 0, repaired.stderr
    assert "repaired: source positions: shop " in repaired.stderr
    assert records(root, "shop.public.t") == before
    with Log.open(root) as log:
        assert log.end_offsets("shop.public.t") == ends
        assert Lsn.ZERO < Lsn.parse(log.positions()["shop"]) <= safe

    second = cli("capture", "--config", str(config), "--until-idle", "1.5")
    assert second.returncode == 0, second.stderr
    after = records(root, "shop.public.t")
    assert [r for r in after if r.offset < ends[r.partition]] == before  # nothing overwritten
    new = [r for r in after if r.offset >= ends[r.partition]]  # offsets continue
    ops = [orjson.loads(r.value).get("op") for r in new if r.value]
    assert ops.count("u") == 10 and "r" not in ops  # the slot resumed: no second snapshot
    state = table_state(root, "shop.public.t")
    assert len(state) == 100 and sum(1 for row in state.values() if row["v"] == "b") == 10
