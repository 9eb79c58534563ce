"""The README's Quick start, run as written: its ```sh blocks under "## Quick start", in order, in one
bash, in an empty directory, so the README cannot rot.

Only two things are put in: the directory holds a link `.venv` to this checkout's `.venv` (the README
runs from a checkout after `make setup`), and the API's port is a free one instead of 8000 (set as
`TRIBUTARY_API__PORT`, and `:8000` in the curl commands). Every block's output is checked for what
that step should do; whatever the script started is stopped afterwards even when it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.waiting import run_process, size_of, wait_exit
from tributary.api.devdb.embedded import EmbeddedPostgres, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARK = "::quickstart block {}::"


def quickstart_blocks(text: str) -> list[str]:
    """The ```sh blocks of the README's "## Quick start" section, in order."""
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```sh\n(.*?)^```$", section, flags=re.S | re.M)


def script(blocks: list[str], port: int) -> str:
    """One bash script: the blocks with a marker line before each, stopping at the first failure."""
    lines = [
        "set -euo pipefail",
        # a safety net for a failing step: the README's own last block stops everything otherwise
        "trap 'rc=$?; set +e; kill $(jobs -p) 2>/dev/null; wait; [ $rc = 0 ] || tributary pg down; exit $rc' EXIT",
    ]
    for n, block in enumerate(blocks):
        lines.append(f"echo '{MARK.format(n)}'")
        lines.append(block.replace("localhost:8000", f"localhost:{port}"))
    lines.append(f"echo '{MARK.format('end')}'")
    return "\n".join(lines) + "\n"


def test_quickstart_blocks_are_found() -> None:
    blocks = quickstart_blocks(README.read_text())
    assert len(blocks) >= 5
    text = "\n".join(blocks)
    for step in ("tributary pg up", "tributary init", "tributary capture", "tributary serve", "tributary pg down"):
        assert step in text, step


def _checkout(tmp_path: Path) -> Path:
    """An empty directory standing for the checkout: only a link `.venv` to this one's."""
    work = tmp_path / "checkout"
    work.mkdir()
    (work / ".venv").symlink_to(ROOT / ".venv")
    return work


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRIBUTARY_") and k != "COLUMNS"}


def test_quickstart_runs_as_written(tmp_path: Path) -> None:
    _run_quickstart(tmp_path, _checkout(tmp_path))


def test_quickstart_runs_after_make_demo_in_the_same_checkout(tmp_path: Path) -> None:
    """The README's first command is `make demo`: the Quick start, next, in the same checkout, must
    start clean (the demo keeps its cluster, its `shop` and its log to itself)."""
    work = _checkout(tmp_path)
    demo = run_process(
        [str(work / ".venv" / "bin" / "tributary"), "demo", "--duration", "10"],
        what="tributary demo",
        cwd=work,
        env={**_clean_env(), "TRIBUTARY_API__PORT": str(free_port())},
    )
    assert demo.returncode == 0 and "summary shop transactions=" in demo.stdout, demo.stdout + demo.stderr
    _run_quickstart(tmp_path, work)


def _run_quickstart(tmp_path: Path, work: Path) -> None:
    """Run the Quick start's blocks in `work` and check what every step printed and left."""
    blocks = quickstart_blocks(README.read_text())
    port = free_port()
    (tmp_path / "quickstart.sh").write_text(script(blocks, port))
    env = _clean_env()
    env["TRIBUTARY_API__PORT"] = str(port)
    printed = tmp_path / "quickstart.out"
    with printed.open("wb") as sink:
        proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc", str(tmp_path / "quickstart.sh")],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    cluster = EmbeddedPostgres(work / ".tributary" / "pg")
    try:
        wait_exit(proc, what="the Quick start", progress=lambda: size_of(printed, *work.glob("*.log")))
        out = printed.read_text()
        left_running = cluster.is_running()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        wait_exit(proc, what="the Quick start to stop")
        cluster.destroy()
    logs = "".join(f"\n--- {p.name}\n{p.read_text()}" for p in work.glob("*.log"))
    assert proc.returncode == 0 and MARK.format("end") in out, out + logs
    steps = re.split(r"^::quickstart block \S+::$", out, flags=re.M)[1:]
    assert len(steps) == len(blocks) + 1, out
    setup, config, start, commands, project, stop, _ = steps

    # pg up prints the DSN; the shop database and its table exist
    assert re.search(r"^postgresql://\w+@127\.0\.0\.1:\d+/tributary$", setup, flags=re.M), setup
    assert "CREATE DATABASE" in setup and "CREATE TABLE" in setup, setup

    # the config names the source shop with the DSN `pg dsn --database shop` printed
    toml = (work / "tributary.toml").read_text()
    assert re.search(r'name = "shop"\ndsn = "postgresql://\w+@127\.0\.0\.1:\d+/shop"', toml), toml
    assert (work / "my_projections" / "balances.py").exists() and not config.strip(), config

    # init migrates and creates the slot; serve answers
    assert "migrations at" in start and "created replication slot tributary_shop" in start, start
    assert '"status":"ok"' in start.replace(" ", ""), start

    # the commands are accepted, the state is folded, and both the shop and the events are in the log
    versions = [int(v) for v in re.findall(r'^\{"stream_id":"acc-1","version":(\d+)', commands, flags=re.M)]
    assert versions == [1, 2, 3], commands
    assert '"balance":"7.50"' in commands, commands
    assert re.search(r"^shop\.public\.orders\t", commands, flags=re.M), commands
    assert re.search(r"^events\.account\t", commands, flags=re.M), commands
    assert "shop.public.customers" not in commands, commands  # only what this Quick start made
    assert '"after":{"id":1,"customer":"ada","total":"15.00"}' in commands, commands
    assert '"type":"MoneyWithdrawn"' in commands, commands

    # the buggy projection serves 12.50; after the fix and the version bump, the rebuilt view 7.50
    views = re.findall(r'^\{"view":"balances".*$', project, flags=re.M)
    assert len(views) == 2, project
    assert '"balance":"12.50"' in views[0] and '"balance":"7.50"' in views[1], project
    assert all(v.count('"account_id"') == 1 for v in views), project  # acc-1's row only
    assert "balances: rebuilt build 1 (balances__v1_1)" in project, project
    assert "balances: rebuilt build 2 (balances__v2_2)" in project, project

    # everything stopped: capture committed and said so for every source, the cluster is down
    assert "stopped" in stop, stop
    captured = json.loads((work / ".tributary" / "log" / "capture-status.json").read_text())
    assert {s["name"]: s["state"] for s in captured["sources"]} == {"shop": "stopped", "_eventstore": "stopped"}
    assert "Traceback" not in logs, logs
    assert not left_running
