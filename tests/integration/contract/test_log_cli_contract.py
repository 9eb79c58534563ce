"""`tributary log …` on every log backend, records written through the product's own writer
(`tributary.log.open_writer`): `topics`, `cat` (a partition, an offset, `--compacted`), `cat
--follow` ending cleanly on a signal, `verify` after capture ran."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from tests import waiting
from tests.backends import LogBackend, write_backend_config, writer
from tests.integration.capture.helpers import cli
from tests.pg import REPO_ROOT
from tributary.log import TopicConfig
from tributary.log.local import canonical_json, partition_for

pytestmark = pytest.mark.e2e

TOPIC = "shop.public.orders"
# Record times of today, not of 1970: a broker rolls a segment whose first record is older than
# `segment.ms` at once, and its cleaner then compacts the topic under the test's reads.
T0 = int(time.time() * 1000) // 1000 * 1000


def _write(backend: LogBackend, log_root: Path, rows: list[tuple[Any, Any, int]], writer_id: str) -> None:
    """Commit (key, value, timestamp) rows to TOPIC (3 partitions, compacted), each at its key's
    partition, the first with a header; then append one record no commit covers, and close."""
    log = writer(backend, log_root, ["shop"], writer_id)
    try:
        shop = log.source("shop")
        if TOPIC not in shop.topics():
            shop.create_topic(TOPIC, TopicConfig(partitions=3, policy="compact"))
        for i, (key, value, ts) in enumerate(rows):
            k = canonical_json(key)
            v = None if value is None else canonical_json(value)
            shop.append(TOPIC, partition_for(k, 3), [(k, v, ts, b'{"tx":"7"}' if i == 0 else None)])
        log.commit()
        shop.append(TOPIC, 0, [(canonical_json({"id": 99}), b'{"never":true}', T0 + 5_000, None)])
    finally:
        log.close()  # drops the uncommitted record


@pytest.fixture
def config(tmp_path: Path, backend: LogBackend) -> Path:
    """A config on `backend` whose log holds 12 committed records of 3 keys, the last a tombstone."""
    log_root = tmp_path / "log"
    backend.prepare(TOPIC)
    rows = [({"id": i % 3}, None if i == 11 else {"n": i, "price": "1.10"}, T0 + i) for i in range(12)]
    _write(backend, log_root, rows, "cli-1")
    return write_backend_config(backend, tmp_path / "t.toml", dsn="postgresql://unused", log_root=log_root)


def _lines(out: str) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in out.splitlines()]


def test_topics_lists_each_topic_with_its_partitions(config: Path, backend: LogBackend) -> None:
    res = cli("log", "topics", "--config", str(config))
    assert res.returncode == 0, res.stderr
    assert f"{TOPIC}\tpartitions=3\tpolicy={backend.topic_policy}\t" in res.stdout


def test_cat_prints_every_committed_record_as_json_lines(config: Path) -> None:
    res = cli("log", "cat", TOPIC, "--config", str(config))
    assert res.returncode == 0, res.stderr
    got = _lines(res.stdout)
    assert sorted(r["timestamp"] for r in got) == list(range(T0, T0 + 12))  # the uncommitted one is not there
    assert all(set(r) == {"topic", "partition", "offset", "timestamp", "key", "value", "headers"} for r in got)
    first = next(r for r in got if r["timestamp"] == T0)
    assert first["key"] == {"id": 0} and first["value"] == {"n": 0, "price": "1.10"} and first["headers"] == {"tx": "7"}
    assert next(r for r in got if r["timestamp"] == T0 + 11)["value"] is None
    for p in range(3):  # each partition in offset order, each key in its partition
        mine = [r for r in got if r["partition"] == p]
        assert [r["offset"] for r in mine] == sorted({r["offset"] for r in mine})
        assert [r["timestamp"] for r in mine] == sorted(r["timestamp"] for r in mine)
        assert all(partition_for(canonical_json(r["key"]), 3) == p for r in mine)
    p = first["partition"]
    later = _lines(cli("log", "cat", TOPIC, "--partition", str(p), "--from", "1", "--config", str(config)).stdout)
    mine = sorted(r["offset"] for r in got if r["partition"] == p)
    assert [r["offset"] for r in later] == mine[1:]


def test_cat_compacted_shows_the_latest_record_per_key(config: Path) -> None:
    res = cli("log", "cat", TOPIC, "--compacted", "--config", str(config))
    assert res.returncode == 0, res.stderr
    # id 0 -> n=9, id 1 -> n=10, id 2 -> its latest (n=11) is a tombstone
    assert sorted((r["key"]["id"], r["value"]["n"]) for r in _lines(res.stdout)) == [(0, 9), (1, 10)]


def _next_lines(proc: subprocess.Popen[bytes], n: int) -> list[dict[str, Any]]:
    """The next `n` lines, however long each takes (a hang is pytest-timeout's to end)."""
    assert proc.stdout is not None
    out: list[dict[str, Any]] = []
    while len(out) < n:
        line = proc.stdout.readline()
        assert line, f"output ended after {len(out)} of {n} lines"
        out.append(orjson.loads(line))
    return out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_cat_follow_prints_new_commits_and_ends_cleanly(
    config: Path, tmp_path: Path, backend: LogBackend, sig: signal.Signals
) -> None:
    cmd = [sys.executable, "-c", "from tributary.api.cli.main import main; main()", "log", "cat", TOPIC]
    proc = subprocess.Popen(
        [*cmd, "--follow", "--compacted", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    try:
        first = _next_lines(proc, 2)  # the compacted view of what is there
        assert sorted((r["key"]["id"], r["value"]["n"]) for r in first) == [(0, 9), (1, 10)]
        # committed later: every record, as it comes
        _write(backend, tmp_path / "log", [({"id": 5}, {"n": 0}, T0 + 2000), ({"id": 0}, {"n": 1}, T0 + 2001)], "cli-2")
        later = _next_lines(proc, 2)
        assert sorted((r["key"]["id"], r["value"]["n"]) for r in later) == [(0, 1), (5, 0)]
        proc.send_signal(sig)
        waiting.wait_exit(proc, what="log cat --follow to end")
        rest, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert rest == b"" and b"Traceback" not in err


def test_verify_after_capture_ran_is_ok(fresh_db: str, tmp_path: Path, backend: LogBackend) -> None:
    backend.prepare("shop.public.items")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 20) g")
    config = write_backend_config(backend, tmp_path / "t.toml", dsn=fresh_db, log_root=tmp_path / "log")
    res = cli("capture", "--config", str(config), "--until-idle", "1")
    assert res.returncode == 0, res.stderr
    done = cli("log", "verify", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("ok: "), done.stdout
    listed = cli("log", "topics", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert f"shop.public.items\tpartitions=3\tpolicy={backend.topic_policy}\t" in listed.stdout


def test_compact_compacts_the_local_log_and_leaves_kafka_to_its_brokers(config: Path, backend: LogBackend) -> None:
    res = cli("log", "compact", "--config", str(config))
    assert res.returncode == 0, res.stdout + res.stderr
    if backend.name == "kafka":
        assert res.stdout.startswith("the log is Kafka's: its brokers compact"), res.stdout
        assert not (config.parent / "log").exists(), "nothing written to a local root"
    else:
        assert res.stdout.startswith("compacted: "), res.stdout  # sealed segments only: none here
