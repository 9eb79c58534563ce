"""The snapshot under way, as a user sees it: a table added to `include` later is snapshotted
chunked beside the stream, and `capture status`, `GET /sources` and `/metrics` show it (method,
table, chunks, rows of estimated, tables pending) while it runs, and nothing once it is done."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.integration.capture.helpers import capture_progress, cli, spawn_capture, table_state, wait_for, write_config
from tests.servers import serving
from tributary.api.devdb.embedded import free_port
from tributary.capture.status import read_status
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.integration

ROWS = 100_000
CHUNK_ROWS = 100  # many chunks: the snapshot is under way long enough to look at


def _source(log_root: Path, pid: int) -> dict[str, Any] | None:
    doc = read_status(log_root) or {}
    if doc.get("pid") != pid:
        return None  # a previous process's file
    return next((s for s in doc.get("sources", []) if s["name"] == "shop"), None)


def test_a_table_added_later_shows_as_pending_then_snapshotting_then_done(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 10) g")
        conn.execute("CREATE TABLE late (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO late SELECT g, 'v' || g FROM generate_series(1, %s) g", (ROWS,))
        conn.execute("CREATE TABLE later (id int PRIMARY KEY)")
        conn.execute("INSERT INTO later SELECT generate_series(1, 50)")
        conn.execute("ANALYZE")
    log_root = tmp_path / "log"
    config = write_config(
        tmp_path / "t.toml",
        dsn=fresh_db,
        log_root=log_root,
        source_extra=f'snapshot_chunk_rows = {CHUNK_ROWS}\nsnapshot_method = "chunked"',
        extra=f'[api]\nport = {free_port()}\nstatus_refresh_s = 0.5\n\n[service]\ndsn = "{fresh_db}"\n',  # serve needs a service database
    )
    run_migrations(fresh_db)
    port = int(config.read_text().split("[api]\nport = ")[1].split()[0])
    only_t = config.read_text()
    config.write_text(only_t.replace('include = ["public.*"]', 'include = ["public.t"]'))
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr

    config.write_text(only_t)  # include widened: late and later were never snapshotted
    with serving(config, port, err_path=tmp_path / "serve.err") as base:  # up before the snapshot starts
        proc = spawn_capture(config)
        try:

            def under_way() -> bool:
                src = _source(log_root, proc.pid)
                return bool(src and src.get("snapshot_table") == "public.late" and src.get("snapshot_chunk", 0) >= 2)

            wait_for(
                under_way,
                timeout=60,
                what="the chunked snapshot of public.late under way",
                progress=lambda: capture_progress(log_root),
            )
            snap = next(s for s in httpx.get(base + "/sources").json() if s["name"] == "shop")["snapshot"]
            assert snap is not None, "GET /sources shows the snapshot under way"
            assert snap["method"] == "chunked" and snap["table"] == "public.late"
            assert snap["chunks_done"] >= 2 and 0 < snap["rows_done"] < ROWS
            assert snap["rows_estimated"] >= ROWS and "public.later" in snap["tables_pending"]

            def metrics_show_it() -> bool:  # the API refreshes its metrics every `status_refresh_s`
                text = httpx.get(base + "/metrics").text
                return (
                    'tributary_capture_snapshot_running{method="chunked",source="shop"} 1.0' in text
                    and 'tributary_capture_snapshot_running{method="consistent",source="shop"} 0.0' in text
                    and 'tributary_capture_snapshot_tables_pending{source="shop"} 2.0' in text
                )

            wait_for(
                metrics_show_it,
                timeout=30,
                what="the metrics to show the snapshot under way",
                progress=lambda: capture_progress(log_root),
            )
            shown = cli("capture", "status", "--config", str(config))
            assert shown.returncode == 0, shown.stderr
            line = next(line for line in shown.stdout.splitlines() if line.startswith("shop "))
            assert line.startswith("shop streaming"), line
            assert "snapshot (chunked) public.late chunk " in line and "/~" in line, line
            assert "pending public.later" in line, line

            def done() -> bool:
                src = _source(log_root, proc.pid)
                return bool(src and not src.get("snapshot_tables_pending"))

            wait_for(
                done,
                timeout=120,
                what="the snapshot of the added tables to end",
                progress=lambda: capture_progress(log_root),
            )

            def metrics_idle() -> bool:
                text = httpx.get(base + "/metrics").text
                return 'tributary_capture_snapshot_running{method="chunked",source="shop"} 0.0' in text

            wait_for(
                metrics_idle,
                timeout=30,
                what="the metrics to show no snapshot",
                progress=lambda: capture_progress(log_root),
            )
            assert next(s for s in httpx.get(base + "/sources").json() if s["name"] == "shop")["snapshot"] is None
            assert "snapshot" not in next(
                line for line in cli("capture", "status", "--config", str(config)).stdout.splitlines() if "shop" in line
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert len(table_state(log_root, "shop.public.late")) == ROWS
    assert len(table_state(log_root, "shop.public.later")) == 50
