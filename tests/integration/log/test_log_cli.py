"""`tributary log …` driven through the typer app, on the local log where it differs on purpose from
Kafka: `cat` merges partitions by time, `verify` reads every record's CRC, `compact` and `--repair`
are the local log's own, a mistyped `--root`. What every backend's `log` commands share is in
tests/integration/contract/test_log_cli_contract.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from tributary.api.cli.log import log_app
from tributary.log.local import Log, TopicConfig, canonical_json
from tributary.log.local.cleaner import Cleaner, CleanerPolicy

pytestmark = pytest.mark.e2e

runner = CliRunner()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "log"
    with Log.open(root, writer=True, segment_bytes=300) as log:
        log.create_topic("shop.public.orders", TopicConfig(partitions=2, policy="compact"))
        for i in range(12):
            key = canonical_json({"id": i % 3})
            value = None if i == 11 else canonical_json({"n": i, "price": "1.10"})
            log.append(
                "shop.public.orders",
                log.partition_for("shop.public.orders", key),
                [(key, value, 1000 + i, b'{"tx":7}' if i == 0 else None)],
            )
        log.commit()
        log.append("shop.public.orders", 0, [(None, b"1", 5000, None)])  # never committed
    return root


def lines(out: str) -> list[dict]:
    return [orjson.loads(x) for x in out.splitlines()]


def test_cat_prints_json_lines_merged_by_time(root: Path) -> None:
    res = runner.invoke(log_app, ["cat", "shop.public.orders", "--root", str(root)])
    assert res.exit_code == 0, res.output
    got = lines(res.stdout)
    assert [r["timestamp"] for r in got] == list(range(1000, 1012))
    first = got[0]
    assert set(first) == {"topic", "partition", "offset", "timestamp", "key", "value", "headers"}
    assert first["key"] == {"id": 0} and first["value"] == {"n": 0, "price": "1.10"}
    assert first["headers"] == {"tx": 7} and got[-1]["value"] is None
    one = lines(
        runner.invoke(
            log_app,
            [
                "cat",
                "shop.public.orders",
                "--root",
                str(root),
                "--partition",
                str(first["partition"]),
                "--from",
                "1",
            ],
        ).stdout
    )
    assert one and all(r["partition"] == first["partition"] and r["offset"] >= 1 for r in one)


def test_verify_ok_then_corrupt(root: Path) -> None:
    res = runner.invoke(log_app, ["verify", "--root", str(root)])
    assert res.exit_code == 0 and res.stdout.startswith("ok")
    seg = sorted((root / "shop.public.orders").rglob("*.log"))[0]
    data = bytearray(seg.read_bytes())
    data[data.index(b'"n":') + 4] ^= 0x03
    seg.write_bytes(bytes(data))
    res = runner.invoke(log_app, ["verify", "--root", str(root)])
    assert res.exit_code == 1
    assert "corrupt: shop.public.orders/" in res.stderr and "CRC mismatch" in res.stderr
    res = runner.invoke(log_app, ["cat", "shop.public.orders", "--root", str(root)])
    assert res.exit_code == 1 and res.stderr.startswith("tributary: corrupt record in shop.public.orders/")


def test_compact_and_refusal_while_capture_runs(root: Path) -> None:
    res = runner.invoke(log_app, ["compact", "--root", str(root)])
    assert res.exit_code == 0 and res.stdout.startswith("compacted:"), res.output
    # `records` counts what is left, not the offset span (12)
    left = len(runner.invoke(log_app, ["cat", "shop.public.orders", "--root", str(root)]).stdout.splitlines())
    res = runner.invoke(log_app, ["topics", "--root", str(root)])
    assert left < 12 and f"policy=compact\trecords={left}\t" in res.stdout, res.output
    with Log.open(root, writer=True):
        res = runner.invoke(log_app, ["compact", "shop.public.orders", "--root", str(root)])
    assert res.exit_code == 1  # a writer without a background cleaner: nobody would compact
    assert res.stderr.strip().startswith(f"tributary: cannot compact: pid {os.getpid()} holds the log at {root}")
    assert len(res.stderr.strip().splitlines()) == 1
    with Log.open(root, writer=True) as log:  # a writer that runs the cleaner (as capture does)
        Cleaner(log, CleanerPolicy(interval_ms=15_000), pid=os.getpid()).step(int(time.time() * 1000))
        res = runner.invoke(log_app, ["compact", "shop.public.orders", "--root", str(root)])
    assert res.exit_code == 0 and res.stderr == "", res.output
    assert res.stdout.startswith(f"capture (pid {os.getpid()}) is running and compacts in the background every 15 s; ")
    assert len(res.stdout.strip().splitlines()) == 1


def test_errors_are_one_line(tmp_path: Path, root: Path) -> None:
    res = runner.invoke(log_app, ["cat", "nope", "--root", str(root)])
    assert res.exit_code == 1 and res.stderr == f"tributary: no topic 'nope' in the log at {root}\n"
    res = runner.invoke(log_app, ["topics", "--root", str(tmp_path / "missing")])
    assert res.exit_code == 1 and "no log at" in res.stderr


def test_verify_repair_cuts_a_torn_committed_tail(root: Path) -> None:
    Log.open(root, writer=True).close()  # recovery drops the fixture's uncommitted record
    seg = max((root / "shop.public.orders" / "0").glob("*.log"))
    seg.write_bytes(seg.read_bytes()[:-20])
    res = runner.invoke(log_app, ["cat", "shop.public.orders", "--root", str(root)])
    assert res.exit_code == 1 and "tributary: corrupt record" in res.stderr
    res = runner.invoke(log_app, ["verify", "--repair", "--root", str(root)])
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith("repaired: shop.public.orders/0 ") and "lost" in res.stderr
    assert runner.invoke(log_app, ["cat", "shop.public.orders", "--root", str(root)]).exit_code == 0


def test_without_its_manifest_every_command_refuses_until_repair_rebuilds_it(root: Path) -> None:
    Log.open(root, writer=True).close()  # recovery drops the fixture's uncommitted record
    before = runner.invoke(log_app, ["cat", "shop.public.orders", "--root", str(root)]).stdout
    topics_before = runner.invoke(log_app, ["topics", "--root", str(root)]).stdout
    assert before and "shop.public.orders" in topics_before
    (root / "manifest.json").unlink()
    refusal = (
        f"tributary: the log at {root} has segment files but no manifest.json, so it is not empty; "
        f"run `tributary log verify --repair --root {root}` to rebuild it from the segments\n"
    )
    for cmd in (["topics"], ["cat", "shop.public.orders"], ["verify"], ["compact"]):
        res = runner.invoke(log_app, [*cmd, "--root", str(root)])
        assert res.exit_code == 1 and res.stderr == refusal, (cmd, res.output)
    res = runner.invoke(log_app, ["verify", "--repair", "--root", str(root)])
    assert res.exit_code == 0, res.output
    assert res.stderr.startswith("repaired: manifest.json was missing: rebuilt from the segment files\n")
    assert res.stdout == f"ok: every committed record in {root} is intact\n"
    assert runner.invoke(log_app, ["cat", "shop.public.orders", "--root", str(root)]).stdout == before
    assert runner.invoke(log_app, ["topics", "--root", str(root)]).stdout == topics_before


@pytest.mark.parametrize(
    "cmd", [["compact"], ["verify", "--repair"], ["verify"], ["topics"], ["cat", "shop.public.orders"]]
)
def test_a_mistyped_root_is_no_log_and_is_not_created(tmp_path: Path, cmd: list[str]) -> None:
    wrong = tmp_path / "lgo"
    res = runner.invoke(log_app, [*cmd, "--root", str(wrong)])
    assert res.exit_code == 1 and res.stderr == f"tributary: no log at {wrong}\n", res.output
    assert not wrong.exists()


def test_topics_shows_schema_records_apart(tmp_path: Path) -> None:
    root = tmp_path / "log"
    with Log.open(root, writer=True) as log:
        log.create_topic("shop.public.t", TopicConfig(partitions=1, policy="compact"))
        schema = (b'{"__schema__":true}', b'{"schema":{"columns":[["id","integer",23]]}}', 1, None)
        log.append("shop.public.t", 0, [schema, (b'{"id":1}', b'{"op":"r"}', 2, None), (b'{"id":2}', b"{}", 3, None)])
        log.commit()
    res = runner.invoke(log_app, ["topics", "--root", str(root)])
    assert res.exit_code == 0, res.output
    assert "\trecords=3\tdata_records=2\tschema_records=1\t" in res.stdout
