"""The capture daemon's background cleaner, as a user runs it: `tributary capture` with tiny
segments and a short cleaner interval, a real Postgres, readers working while it compacts, and
kill -9 in the middle of compactions."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from tests.integration.capture.helpers import capture_progress, cli, records, spawn_capture, table_state, wait_for
from tests.servers import serving
from tests.waiting import Stalled, wait_progress
from tributary.api.devdb.embedded import free_port
from tributary.eventstore.migrate import run_migrations
from tributary.log.local import Log, admin, read_split
from tributary.log.local.cleaner import read_checkpoint

pytestmark = pytest.mark.integration

TOPIC = "shop.public.kv"


def _config(path: Path, *, dsn: str, root: Path, interval: float, retention_ms: int, ratio: float = 0.3) -> Path:
    run_migrations(dsn)  # what `tributary init` does: capture refuses a service database before it
    path.write_text(
        f"""
[service]
dsn = "{dsn}"

[log]
root = "{root}"
partitions = 2
segment_bytes = 4096
linger_ms = 2
cleaner_interval_s = {interval}
min_cleanable_dirty_ratio = {ratio}
delete_retention_ms = {retention_ms}
file_delete_delay_ms = 500

[capture]
status_interval_s = 1.0
max_backoff_s = 2.0
capture_eventstore = false

[api]
port = {free_port()}

[[sources]]
name = "shop"
dsn = "{dsn}"
slot = "slot_bg_{abs(hash(str(root))) % 100000}"
include = ["public.*"]
"""
    )
    return path


def _table(dsn: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT id, v, pad FROM kv ORDER BY id").fetchall()
    return {f'{{"id":{i}}}': {"id": i, "v": v, "pad": pad} for i, v, pad in rows}


def _fold(state: dict[str, Any], key: bytes | None, value: bytes | None) -> None:
    """A consumer's table view of a CDC topic: upserts, deletes and tombstones."""
    if key is None:
        return
    k = key.decode()
    if value is None:
        state.pop(k, None)
        return
    v = orjson.loads(value)
    if "op" not in v:
        return  # a schema record
    if v["op"] == "d":
        state.pop(k, None)
    else:
        state[k] = v["after"]


def _on_disk(root: Path) -> int:
    """Records in the topic's segment files (committed or not): what compaction shrinks."""
    n = 0
    for f in (root / TOPIC).rglob("*.log"):
        try:
            n += f.read_bytes().count(b"\n")
        except FileNotFoundError:
            continue  # emptied and removed by the cleaner since listed
    return n


class _Reader(threading.Thread):
    """A reader of the log at `root` in a thread until `stop`; what goes wrong, and anything it
    raises, is kept in `errors` (the test asserts there was none)."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.stop = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            self.read_along()
        except Exception as exc:  # noqa: BLE001 - the test asserts there was none
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def read_along(self) -> None:
        raise NotImplementedError


class Follower(_Reader):
    """`log cat --follow` in a thread: reads every partition on from where it was, refreshing the
    manifest, folding what it reads; checks each record is intact, each offset new and higher."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.state: dict[str, Any] = {}
        self.read = 0
        self.next: dict[int, int] = {}

    def read_along(self) -> None:
        wait_for(
            lambda: (self.root / "manifest.json").exists(), what="the log", progress=lambda: capture_progress(self.root)
        )
        log = Log.open(self.root)
        while True:
            done = self.stop.is_set()  # decide before reading: then one last full pass
            log.refresh()
            if TOPIC in log.topics():
                for p, end in enumerate(log.end_offsets(TOPIC)):
                    for i, r in enumerate(log.read(TOPIC, p, self.next.get(p, 0), to_offset=end)):
                        if r.offset < self.next.get(p, 0):
                            self.errors.append(f"{p}: offset {r.offset} after {self.next[p] - 1}")
                        self.next[p] = r.offset + 1
                        _fold(self.state, r.key, r.value)
                        self.read += 1
                        if i % 300 == 299:
                            time.sleep(0.005)  # slow enough for compactions to land meanwhile
            if done:
                return
            time.sleep(0.02)


class CatFollower(_Reader):
    """`tributary log cat TOPIC --follow` itself (its function, writing to this object)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.state: dict[str, Any] = {}
        self.next: dict[int, int] = {}
        self._polls_after_stop = 0

    def write(self, data: bytes) -> None:
        for line in data.splitlines():
            r = orjson.loads(line)
            p, off = r["partition"], r["offset"]
            if off < self.next.get(p, 0):
                self.errors.append(f"cat: {p}/{off} after {self.next[p] - 1}")
            self.next[p] = off + 1
            _fold(
                self.state,
                orjson.dumps(r["key"]) if r["key"] is not None else None,
                orjson.dumps(r["value"]) if r["value"] is not None else None,
            )

    def flush(self) -> None:
        pass

    def _go_on(self) -> bool:
        if self.stop.is_set():
            self._polls_after_stop += 1
        return self._polls_after_stop < 2  # one whole pass after the stop

    def read_along(self) -> None:
        wait_for(lambda: TOPIC in _topics(self.root), 60, "the topic", progress=lambda: capture_progress(self.root))
        admin.cat(self.root, TOPIC, follow=True, out=self, poll_s=0.02, on_poll=self._go_on)  # type: ignore[arg-type]


def _topics(root: Path) -> dict[str, Any]:
    try:
        with Log.open(root) as log:
            return dict(log.topics())
    except Exception:  # noqa: BLE001 - not created yet
        return {}


class Splitter(_Reader):
    """A Spark-like reader: plans splits, waits a little (compactions land), then reads them in a
    random order; each pass must give intact records, each offset once, below the planned end."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.passes = 0
        self.rng = random.Random(7)

    def read_along(self) -> None:
        wait_for(
            lambda: (self.root / "manifest.json").exists(), what="the log", progress=lambda: capture_progress(self.root)
        )
        while not self.stop.is_set():
            log = Log.open(self.root)
            if TOPIC not in log.topics():
                time.sleep(0.1)
                continue
            splits = log.splits(TOPIC, max_bytes=1500)
            ends = log.end_offsets(TOPIC)
            time.sleep(self.rng.uniform(0.05, 0.6))
            self.rng.shuffle(splits)
            seen: set[tuple[int, int]] = set()
            for s in splits:
                for r in read_split(s):
                    if (r.partition, r.offset) in seen or r.offset >= ends[r.partition]:
                        self.errors.append(f"offset {r.partition}/{r.offset} twice or past the plan")
                    seen.add((r.partition, r.offset))
                    if r.value is not None:
                        orjson.loads(r.value)
            self.passes += 1


def _writer(dsn: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """Update five hot keys over and over; now and then insert a short-lived key and delete it."""
    rng = random.Random(3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            with conn.transaction():
                k = rng.randint(1, 5)
                conn.execute("UPDATE kv SET v = v + 1 WHERE id = %s", (k,))
                if rng.random() < 0.05:
                    doomed = 1000 + counts["deleted"]
                    conn.execute("INSERT INTO kv VALUES (%s, 0, 'short-lived')", (doomed,))
                    conn.execute("DELETE FROM kv WHERE id = %s", (doomed,))
                    counts["deleted"] += 1
            counts["tx"] += 1
            time.sleep(0.0005)


def test_cleaner_compacts_while_capture_runs_and_readers_stay_correct(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE kv (id int PRIMARY KEY, v int NOT NULL, pad text)")
        conn.execute("INSERT INTO kv SELECT g, 0, repeat('p', 40) FROM generate_series(1, 5) g")
    root = tmp_path / "log"
    retention_ms = 1500
    config = _config(tmp_path / "t.toml", dsn=fresh_db, root=root, interval=0.3, retention_ms=retention_ms)
    follower, splitter, cat = Follower(root), Splitter(root), CatFollower(root)
    stop, counts = threading.Event(), {"tx": 0, "deleted": 0}
    writer = threading.Thread(target=_writer, args=(fresh_db, stop, counts))
    proc = spawn_capture(config)
    try:
        follower.start()
        splitter.start()
        cat.start()
        writer.start()
        wait_for(
            lambda: read_checkpoint(root).get("last_compaction_ms") is not None,
            60,
            "a background compaction",
            progress=lambda: capture_progress(root),
        )
        wait_for(
            lambda: counts["deleted"] >= 5 and counts["tx"] >= 2000,
            120,
            "enough traffic",
            progress=lambda: (counts["tx"], counts["deleted"]),
        )
        deleted_keys = {f'{{"id":{1000 + i}}}'.encode() for i in range(counts["deleted"])}
        # traffic goes on (segments keep rolling, so those tombstones get sealed, covered, old)
        samples: list[int] = []

        def dropped() -> bool:
            samples.append(_on_disk(root))
            return any(b < a for a, b in zip(samples, samples[1:], strict=False))

        with contextlib.suppress(Stalled):  # while the cleaner keeps compacting, up to 20 retention periods
            wait_progress(
                dropped,
                lambda: read_checkpoint(root).get("last_compaction_ms"),
                what="records on disk to drop",
                stall=60,
                ceiling=max(120, 20 * retention_ms / 1000),
                poll=0.05,
            )
        assert any(b < a for a, b in zip(samples, samples[1:], strict=False)), "records on disk never dropped"

        # while it runs: `log compact` answers with the cleaner's state, GET /topics shows it
        res = cli("log", "compact", "--config", str(config))
        assert res.returncode == 0 and res.stderr == "", res.stderr
        assert res.stdout.startswith(
            f"capture (pid {proc.pid}) is running and compacts in the background every 0.3 s; last compaction "
        ), res.stdout
        res = cli("log", "verify", "--config", str(config))  # a reader too, while segments are rewritten
        assert res.returncode == 0 and res.stdout.startswith("ok"), res.stderr
        with serving(config, _port(config), err_path=tmp_path / "serve.err") as base:
            topics = {t["topic"]: t for t in httpx.get(base + "/topics").json()}
        c = topics[TOPIC]["compaction"]
        assert c["cleaner_pid"] == proc.pid and c["last_compaction_ms"] is not None, c
        assert c["records_after"] < c["records_before"] and c["bytes_after"] < c["bytes_before"], c
    finally:
        stop.set()
        writer.join()
    want = _table(fresh_db)
    wait_for(
        lambda: table_state(root, TOPIC) == want, 60, "capture to catch up", progress=lambda: capture_progress(root)
    )
    for t in (follower, splitter, cat):
        t.stop.set()
    for t in (follower, splitter, cat):
        t.join(60)
        assert not t.is_alive()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert follower.errors == [] and splitter.errors == [] and cat.errors == [], (
        follower.errors,
        splitter.errors,
        cat.errors,
    )
    assert splitter.passes >= 3

    captured = records(root, TOPIC)
    changes_captured = counts["tx"] + 2 * counts["deleted"] + 5  # every update, insert+delete, snapshot
    assert len(captured) < changes_captured / 10, "the cleaner left most of the records"
    for p in range(2):
        offs = [r.offset for r in captured if r.partition == p]
        assert offs == sorted(set(offs))
    assert table_state(root, TOPIC) == want  # latest value per key = the source table
    assert follower.state == want  # a reader that read all along ends with the same table
    assert cat.state == want  # … and so does `log cat --follow`
    keys = {r.key for r in captured}
    assert not keys & deleted_keys, "tombstoned keys older than delete_retention_ms must be gone"
    compactions = err.count("compacted shop.public.kv/")
    print(  # noqa: T201 - figures for the report
        f"compactions={compactions} follower_read={follower.read} split_passes={splitter.passes} "
        f"changes={changes_captured} left={len(captured)} samples={samples[:3]}..{samples[-3:]}"
    )
    assert compactions >= 5
    assert cli("log", "verify", "--config", str(config)).returncode == 0


def _port(config: Path) -> int:
    import tomllib

    return int(tomllib.loads(config.read_text())["api"]["port"])


def test_kill_9_during_compaction_loses_and_duplicates_nothing(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE kv (id int PRIMARY KEY, v int NOT NULL, pad text)")
        conn.execute("CREATE TABLE ledger (id int PRIMARY KEY)")
        conn.execute("INSERT INTO kv SELECT g, 0, repeat('p', 200) FROM generate_series(1, 20) g")
    root = tmp_path / "log"
    # compactions nearly all the time: any kill has a fair chance to land inside one
    config = _config(tmp_path / "t.toml", dsn=fresh_db, root=root, interval=0.02, retention_ms=0, ratio=0.01)
    stop, committed = threading.Event(), []

    def write() -> None:
        rng = random.Random(11)
        with psycopg.connect(fresh_db, autocommit=True) as conn:
            i = 0
            while not stop.is_set():
                i += 1
                with conn.transaction():
                    conn.execute("INSERT INTO ledger VALUES (%s)", (i,))
                    conn.execute("UPDATE kv SET v = v + 1 WHERE id = %s", (rng.randint(1, 20),))
                committed.append(i)
                time.sleep(0.0005)

    writer = threading.Thread(target=write)
    writer.start()
    rng = random.Random(5)
    mid_compaction = 0
    try:
        for _ in range(8):
            proc = spawn_capture(config)
            time.sleep(rng.uniform(1.0, 2.0))
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and not any(root.rglob("*.compacting")):
                time.sleep(0.001)  # kill as a compaction writes its new files, when we catch one
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            mid_compaction += any(root.rglob("*.compacting"))
    finally:
        stop.set()
        writer.join()
    final = cli("capture", "--config", str(config), "--until-idle", "2")
    assert final.returncode == 0, final.stderr
    res = cli("log", "verify", "--config", str(config))
    assert res.returncode == 0, res.stderr
    assert read_checkpoint(root).get("last_compaction_ms") is not None
    print(f"kills that left a compaction half-done: {mid_compaction} of 8")  # noqa: T201
    assert mid_compaction >= 1, "no kill landed inside a compaction"
    ledger = [r for r in records(root, "shop.public.ledger") if r.value is not None]
    ids = [json.loads(r.value)["after"]["id"] for r in ledger if json.loads(r.value).get("op") in ("c", "r")]
    assert len(ids) == len(set(ids)), "a change was captured twice"
    assert sorted(ids) == sorted(committed), "a committed change is missing"
    with Log.open(root) as log:
        for p in range(2):
            offs = [r.offset for r in log.read("shop.public.kv", p)]
            assert offs == sorted(set(offs))
    assert table_state(root, "shop.public.kv") == _table(fresh_db)
