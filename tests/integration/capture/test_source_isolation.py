"""One bad source does not stop the others (#18 item 5), against real servers: a source on a port
where nothing listens, a source whose server goes away mid-transaction, a source whose slot is
misconfigured. Each is `failed` (or `reconnecting`) with its reason in the status file, `capture
status`, `GET /sources` and `/metrics`, retries on its own, and recovers without a restart; the
other sources and the event store's outbox go on committing."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.integration.capture.helpers import capture_progress, cli, records, spawn_capture, table_state, wait_for
from tests.servers import serving
from tests.waiting import Stalled, wait_exit, wait_progress
from tributary.api.devdb.embedded import EmbeddedPostgres, free_port
from tributary.capture.status import read_status
from tributary.eventstore.migrate import run_migrations
from tributary.eventstore.model import NewEvent
from tributary.eventstore.store import EventStore
from tributary.log.local import Log

pytestmark = pytest.mark.integration

PASSWORD = "s3cret-never-shown"


def _config(
    path: Path, *, dsn: str, root: Path, far_dsn: str, far_slot: str = "slot_far", outbox: bool, extra: str = ""
) -> Path:
    run_migrations(dsn)  # what `tributary init` does: capture refuses a service database before it
    path.write_text(
        f"""
[service]
dsn = "{dsn}"

[log]
root = "{root}"
partitions = 2
linger_ms = 2

[capture]
status_interval_s = 1.0
max_backoff_s = 2.0
capture_eventstore = {"true" if outbox else "false"}

[api]
port = {free_port()}

[[sources]]
name = "shop"
dsn = "{dsn}"
slot = "slot_shop_{abs(hash(str(root))) % 100000}"
include = ["public.*"]

[[sources]]
name = "far"
dsn = "{far_dsn}"
slot = "{far_slot}"
include = ["public.*"]
{extra}
"""
    )
    return path


def _source(root: Path, name: str) -> dict[str, Any]:
    doc = read_status(root) or {"sources": []}
    return next((s for s in doc["sources"] if s["name"] == name), {})


def _state(root: Path, name: str) -> str | None:
    return _source(root, name).get("state")


def test_an_unreachable_source_fails_alone_and_recovers_when_its_server_comes_up(fresh_db: str, tmp_path: Path) -> None:
    root = tmp_path / "log"
    port = free_port()
    far_dsn = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{port}/tributary"
    config = _config(tmp_path / "t.toml", dsn=fresh_db, root=root, far_dsn=far_dsn, outbox=True)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total int)")
        conn.execute("INSERT INTO orders SELECT g, g FROM generate_series(1, 50) g")
    proc = spawn_capture(config)
    far_pg = EmbeddedPostgres(tmp_path / "far-pg")
    store = EventStore.connect(fresh_db, max_size=2)
    try:
        wait_for(
            lambda: _state(root, "far") == "failed" and _state(root, "shop") == "streaming",
            60,
            "the far source failed while the shop streams",
            progress=lambda: capture_progress(root),
        )
        assert proc.proc.poll() is None, proc.communicate(5)[1]
        far = _source(root, "far")
        assert far["error"].startswith("source 'far': ") and "\n" not in far["error"]
        assert PASSWORD not in json.dumps(far) and far["error_kind"] == "unreachable"
        wait_for(
            lambda: _source(root, "far").get("failures", 0) >= 2,
            30,
            "a second attempt (backoff)",
            progress=lambda: capture_progress(root),
        )

        # The others go on: the shop's snapshot and stream, the outbox's events.
        wait_for(
            lambda: _state(root, "_eventstore") == "streaming",
            60,
            "outbox streaming",
            progress=lambda: capture_progress(root),
        )
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("INSERT INTO orders SELECT g, g FROM generate_series(51, 80) g")
        store.append("acct-1", "account", [NewEvent(type="AccountOpened", data={"owner": "a"})], "no_stream")
        wait_for(
            lambda: len(table_state(root, "shop.public.orders")) == 80,
            30,
            "the shop's rows committed",
            progress=lambda: capture_progress(root),
        )
        wait_for(
            lambda: len(records(root, "events.account")) == 1,
            30,
            "the outbox's event committed",
            progress=lambda: capture_progress(root),
        )

        # Everything a user looks at says `failed` and why, in one line without the password.
        shown = cli("capture", "status", "--config", str(config))
        assert shown.returncode == 0, shown.stderr
        far_line = next(line for line in shown.stdout.splitlines() if line.startswith("far "))
        assert far_line.startswith("far failed") and "source 'far': " in far_line and "next try in" in far_line
        assert PASSWORD not in shown.stdout
        with serving(config, _api_port(config), err_path=tmp_path / "serve.err") as base:
            sources = {s["name"]: s for s in httpx.get(base + "/sources").json()}
            assert sources["far"]["state"] == "failed" and sources["far"]["error"].startswith("source 'far': ")
            assert sources["shop"]["state"] == "streaming" and sources["_eventstore"]["state"] == "streaming"

            def metrics_show_it() -> bool:
                text = httpx.get(base + "/metrics").text
                return (
                    'tributary_capture_source_state{source="far",state="failed"} 1.0' in text
                    and 'tributary_capture_source_error{kind="unreachable",source="far"} 1.0' in text
                    and 'tributary_capture_source_state{source="shop",state="streaming"} 1.0' in text
                )

            wait_for(
                metrics_show_it, 30, "the metrics to show the failed source", progress=lambda: capture_progress(root)
            )
            assert PASSWORD not in httpx.get(base + "/metrics").text

        # Its server comes up: the source recovers by itself (snapshot, then stream), no restart.
        far_pg.up(port=port)
        with psycopg.connect(far_pg.dsn(), autocommit=True) as conn:
            conn.execute("CREATE TABLE parts (id int PRIMARY KEY, name text)")
            conn.execute("INSERT INTO parts SELECT g, 'p' || g FROM generate_series(1, 20) g")
        wait_for(
            lambda: _state(root, "far") == "streaming",
            60,
            "the far source recovered",
            progress=lambda: capture_progress(root),
        )
        assert _source(root, "far")["error"] is None
        with psycopg.connect(far_pg.dsn(), autocommit=True) as conn:
            conn.execute("INSERT INTO parts SELECT g, 'p' || g FROM generate_series(21, 30) g")
        wait_for(
            lambda: len(table_state(root, "far.public.parts")) == 30,
            30,
            "the far source's rows",
            progress=lambda: capture_progress(root),
        )
        assert proc.proc.poll() is None
    finally:
        store.close()
        if proc.proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        far_pg.destroy()
    assert proc.returncode == 0, err
    assert PASSWORD not in err
    assert sorted(int(k.split(":")[1].rstrip("}")) for k in table_state(root, "shop.public.orders")) == list(
        range(1, 81)
    )


def test_a_source_cut_mid_transaction_is_re_read_whole_while_the_other_commits(
    fresh_db: str, pg_server: Any, tmp_path: Path
) -> None:
    """The far source's walsender is killed again and again while a big transaction streams: what
    it appended uncommitted is dropped (the log is reopened), the shop's commits in between stay,
    and at the end each table is in the log exactly once."""
    far_db = pg_server.create_database("far")
    far_dsn = pg_server.dsn(far_db)
    try:
        root = tmp_path / "log"
        config = _config(tmp_path / "t.toml", dsn=fresh_db, root=root, far_dsn=far_dsn, outbox=False)
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("CREATE TABLE ticks (id int PRIMARY KEY)")
        with psycopg.connect(far_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE bulk (id int PRIMARY KEY, pad text)")
        proc = spawn_capture(config)
        try:
            wait_for(
                lambda: _state(root, "far") == "streaming" and _state(root, "shop") == "streaming",
                60,
                "both",
                progress=lambda: capture_progress(root),
            )
            done = threading.Event()
            ticks = 0

            def tick() -> None:
                nonlocal ticks
                with psycopg.connect(fresh_db, autocommit=True) as conn:
                    while not done.is_set():
                        ticks += 1
                        conn.execute("INSERT INTO ticks VALUES (%s)", (ticks,))
                        time.sleep(0.01)

            ticker = threading.Thread(target=tick, daemon=True)
            ticker.start()
            rows = 300_000
            with psycopg.connect(far_dsn, autocommit=True) as conn:
                conn.execute("INSERT INTO bulk SELECT g, repeat('x', 50) FROM generate_series(1, %s) g", (rows,))

                def bulk_committed() -> bool:
                    with Log.open(root) as log:
                        topic = "far.public.bulk"
                        return topic in log.topics() and sum(log.end_offsets(topic)) >= rows

                cut_at = _source(root, "far").get("changes", 0)
                for _ in range(8):  # cut its stream while the transaction is being read
                    wait_for(
                        lambda cut_at=cut_at: _source(root, "far").get("changes", 0) > cut_at or bulk_committed(),
                        30,
                        "the far source reading the transaction again",
                        progress=lambda: capture_progress(root),
                    )
                    if bulk_committed():
                        break
                    cut_at = _source(root, "far").get("changes", 0)
                    conn.execute(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                        "WHERE slot_name = 'slot_far' AND active_pid IS NOT NULL"
                    )
            wait_for(
                lambda: _state(root, "far") == "streaming",
                60,
                "far streaming again",
                progress=lambda: capture_progress(root),
            )
            wait_for(
                lambda: len(records(root, "far.public.bulk")) >= rows,
                120,
                "the big transaction",
                progress=lambda: capture_progress(root),
            )
            done.set()
            ticker.join()
            wait_for(
                lambda: len(table_state(root, "shop.public.ticks")) == ticks,
                30,
                "every tick",
                progress=lambda: capture_progress(root),
            )
            far = _source(root, "far")
            assert far["failures"] >= 1 and _source(root, "shop")["failures"] == 0
            assert far["changes"] > rows, far  # appended more than once: a cut transaction was re-read
            assert proc.proc.poll() is None
        finally:
            if proc.proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "reconnecting" in err
        bulk = [r for r in records(root, "far.public.bulk") if r.value and b'"op"' in r.value]
        assert len(bulk) == rows and len({r.key for r in bulk}) == rows  # whole, once
        tick_changes = [r for r in records(root, "shop.public.ticks") if r.value and b'"op"' in r.value]
        assert len(tick_changes) == ticks
    finally:
        pg_server.drop_database(far_db)


def test_a_misconfigured_source_fails_with_its_reason_and_recovers_once_fixed(fresh_db: str, tmp_path: Path) -> None:
    """Configuration errors waiting cannot cure (a slot name taken by a pgoutput slot, a role that
    may not replicate) fail those sources only, retried at the backoff ceiling; fixing them needs
    no restart."""
    root = tmp_path / "log"
    role = f"norep_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE a (id int PRIMARY KEY)")
        conn.execute("SELECT pg_create_logical_replication_slot('taken_slot', 'pgoutput')")
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT SELECT ON a TO {role}")
    norep_dsn = fresh_db.replace("postgres@", f"{role}@", 1)
    assert role in norep_dsn
    extra = f'[[sources]]\nname = "norep"\ndsn = "{norep_dsn}"\nslot = "slot_{role}"\ninclude = ["public.*"]\n'
    config = _config(
        tmp_path / "t.toml", dsn=fresh_db, root=root, far_dsn=fresh_db, far_slot="taken_slot", outbox=False, extra=extra
    )
    proc = spawn_capture(config)
    try:
        wait_for(
            lambda: _state(root, "far") == _state(root, "norep") == "failed" and _state(root, "shop") == "streaming",
            60,
            "far and norep failed, the shop streaming",
            progress=lambda: capture_progress(root),
        )
        far, norep = _source(root, "far"), _source(root, "norep")
        assert far["error_kind"] == "misconfigured" and "not a wal2json slot" in far["error"]
        assert norep["error_kind"] == "misconfigured" and "replication role" in norep["error"], norep
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("INSERT INTO a SELECT generate_series(1, 10)")
        wait_for(
            lambda: len(table_state(root, "shop.public.a")) == 10,
            30,
            "the shop goes on",
            progress=lambda: capture_progress(root),
        )
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("SELECT pg_drop_replication_slot('taken_slot')")
            conn.execute(f"ALTER ROLE {role} REPLICATION")
        wait_for(
            lambda: _state(root, "far") == "streaming",
            30,
            "far recovered once its slot was freed",
            progress=lambda: capture_progress(root),
        )
        wait_for(
            lambda: _state(root, "norep") == "streaming",
            30,
            "norep recovered once granted",
            progress=lambda: capture_progress(root),
        )
        wait_for(
            lambda: len(table_state(root, "far.public.a")) == 10,
            30,
            "far's snapshot",
            progress=lambda: capture_progress(root),
        )
        wait_for(
            lambda: len(table_state(root, "norep.public.a")) == 10,
            30,
            "norep's snapshot",
            progress=lambda: capture_progress(root),
        )
        # What still stops capture as a whole: a second writer of the same log, one line, exit 1.
        second = cli("capture", "--config", str(config), "--until-idle", "1")
        assert second.returncode == 1 and len(second.stderr.strip().splitlines()) == 1, second.stderr
    finally:
        if proc.proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                (f"slot_{role}",),
            )
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")
    assert proc.returncode == 0, err


def _api_port(config: Path) -> int:
    text = config.read_text()
    return int(text.split("[api]\nport = ")[1].split("\n")[0])


def test_a_source_transaction_becomes_visible_whole_while_another_source_commits(
    fresh_db: str, pg_server: Any, tmp_path: Path
) -> None:
    """Sources share the log, one source transaction appended at a time: while one source's big
    transaction streams in, another source's small commits must not commit a part of it (a source
    that then failed would have it cut in two, and readers would see half of it)."""
    far_db = pg_server.create_database("far")
    far_dsn = pg_server.dsn(far_db)
    try:
        root = tmp_path / "log"
        config = _config(
            tmp_path / "t.toml", dsn=fresh_db, root=root, far_dsn=far_dsn, far_slot="slot_whole", outbox=False
        )
        # The big transactions on the first source (read first in a round), the small on the second.
        with psycopg.connect(far_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE ticks (id int PRIMARY KEY)")
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            conn.execute("CREATE TABLE bulk (id int PRIMARY KEY, pad text)")
        proc = spawn_capture(config)
        done = threading.Event()
        try:
            wait_for(
                lambda: _state(root, "far") == "streaming" and _state(root, "shop") == "streaming",
                60,
                "both",
                progress=lambda: capture_progress(root),
            )

            def tick() -> None:
                with psycopg.connect(far_dsn, autocommit=True) as conn:
                    n = 0
                    while not done.is_set():
                        n += 1
                        conn.execute("INSERT INTO ticks VALUES (%s)", (n,))

            ticker = threading.Thread(target=tick, daemon=True)
            ticker.start()
            time.sleep(0.5)
            rows, seen = 200_000, set()
            for round_ in range(3):
                with psycopg.connect(fresh_db, autocommit=True) as conn:
                    conn.execute(
                        "INSERT INTO bulk SELECT g, repeat('x', 20) FROM generate_series(%s, %s) g",
                        (round_ * rows + 1, (round_ + 1) * rows),
                    )

                def committed() -> int:
                    with Log.open(root) as log:
                        topic = "shop.public.bulk"
                        n = sum(log.end_offsets(topic)) if topic in log.topics() else 0
                    seen.add(n)
                    return n

                with contextlib.suppress(Stalled):  # sample the committed count until the round is in
                    wait_progress(
                        lambda round_=round_: committed() >= (round_ + 1) * rows,
                        lambda: capture_progress(root),
                        what=f"round {round_} committed",
                        poll=0.005,
                    )
            done.set()
            ticker.join()
            # Committed counts seen: each transaction's records appear all at once (plus, at most,
            # the table's schema records before its first change).
            partial = sorted(n for n in seen if n % rows > 8)
            assert partial == [], f"parts of a transaction were committed: {partial[:5]}"
        finally:
            done.set()
            if proc.proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        pg_server.drop_database(far_db)


def test_a_stopped_capture_leaves_no_retry_time_behind(fresh_db: str, tmp_path: Path) -> None:
    """A failing source's status keeps its error once capture stops, but no time of a retry that
    no process will make (the console and `capture status` showed one as if it were due)."""
    root = tmp_path / "log"
    far_dsn = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{free_port()}/tributary"
    config = _config(tmp_path / "t.toml", dsn=fresh_db, root=root, far_dsn=far_dsn, outbox=False)
    proc = spawn_capture(config)
    try:
        wait_for(
            lambda: _state(root, "far") == "failed" and _source(root, "far").get("retry_at_ms") is not None,
            60,
            "the far source failed, its retry scheduled",
            progress=lambda: capture_progress(root),
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        wait_exit(proc.proc, what="capture stopping")
    far = _source(root, "far")
    assert far["state"] == "failed" and far["error"], far
    assert far["retry_at_ms"] is None
