"""`tributary serve` follows projection changes without a restart, and says honestly where they stand.

While one `serve` runs: a projection added to `[projections] modules` appears in `/projections` and
`/views/<name>`; a projection that never ran shows the records waiting in its topics as its lag (also
in `tributary_projection_lag_records`); an API rebuild runs the projection file as it is on disk and
labels the build with that file's version; a finished rebuild's progress says `done`.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.projections.helpers import LogWriter
from tests.servers import free_port, served
from tests.waiting import tree_cpu_s, wait_progress
from tributary.eventstore.migrate import run_migrations

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EVENTS = 7  # records on events.account

TALLY = """
from tributary.projections.definition import Fold, Projection, Table

CODE_VERSION = {version}


def initial(key):
    return {{"id": key, "n": 0}}


def apply(s, r):
    return {{"id": s["id"], "n": s["n"] + 1}}


def result(s):
    return {{"stream": s["id"], "n": s["n"], "code_version": CODE_VERSION}}


PROJECTION = Projection(
    name="{name}",
    version=CODE_VERSION,
    topics=("events.account",),
    table=Table.of({{"stream": "text", "n": "bigint", "code_version": "integer"}}, ["stream"]),
    fold=Fold(initial=initial, apply=apply, result=result),
)
"""


def _config(path: Path, dsn: str, root: Path, port: int, modules: list[Path]) -> None:
    listed = ", ".join(f'"{m}"' for m in modules)
    path.write_text(
        f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{root}"\npartitions = 2\n'
        f'[projections]\nmodules = [{listed}]\nspark_master = "local[1]"\n'
        f"[api]\nport = {port}\n"
    )


def _projection(base: str, name: str) -> dict[str, Any]:
    rows = httpx.get(base + "/projections", timeout=60).json()
    return next(p for p in rows if p["name"] == name)


def _rebuild(base: str, server: subprocess.Popen[bytes], name: str) -> dict[str, Any]:
    """Rebuild `name` through the API; its entry once it ended, waiting while it (or serve's Spark) moves."""
    r = httpx.post(f"{base}/projections/{name}/rebuild", timeout=30)
    assert r.status_code == 202, r.text
    rebuild_id = r.json()["id"]
    entry: list[dict[str, Any]] = [r.json()]

    def ended() -> bool:
        entry.append(httpx.get(f"{base}/rebuilds/{rebuild_id}", timeout=30).json())
        return bool(entry[-1]["state"] != "running")

    wait_progress(
        ended,
        lambda: (str(entry[-1]), tree_cpu_s(server.pid)),
        what=f"the rebuild of {name}",
        poll=0.5,
    )
    return entry[-1]


def test_serve_follows_added_and_edited_projections(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    root = tmp_path / "log"
    writer = LogWriter(root)
    writer.topic("events.account")
    for i in range(EVENTS):
        writer.append(
            "events.account", f"acct-{i % 3}", i // 3 + 1, "MoneyDeposited", 1_700_000_000_000 + i, amount="1"
        )
    writer.commit()
    writer.close()

    waiting = tmp_path / "waiting.py"
    waiting.write_text(TALLY.format(name="waiting", version=1))
    tally = tmp_path / "tally.py"
    tally.write_text(TALLY.format(name="tally", version=1))
    port = free_port()
    config = tmp_path / "t.toml"
    _config(config, fresh_db, root, port, [waiting])

    with served(config, port, err_path=tmp_path / "serve.err") as server:
        base = f"http://127.0.0.1:{port}"
        # a projection that never ran: everything in its topics is waiting
        never = _projection(base, "waiting")
        assert never["state"] == "never run" and never["lag"] == EVENTS, never
        metrics = httpx.get(base + "/metrics", timeout=60).text
        assert re.search(r'tributary_projection_lag_records\{projection="waiting"\} 7\.0', metrics), metrics

        # a module added to the config: seen without a restart
        assert httpx.get(base + "/views/tally", timeout=30).status_code == 404
        time.sleep(0.01)  # a later mtime on file systems with coarse timestamps
        _config(config, fresh_db, root, port, [waiting, tally])
        assert _projection(base, "tally")["lag"] == EVENTS
        views: list[httpx.Response] = []

        def known() -> bool:  # /views looks at the files at most once a second
            views.append(httpx.get(base + "/views/tally", timeout=30))
            return "not been built yet" in views[-1].text

        wait_progress(known, lambda: views[-1].text if views else None, what="/views to know tally", poll=0.2)
        assert views[-1].status_code == 404, views[-1].text
        pattern = r'tributary_projection_lag_records\{projection="tally"\} (\S+)'

        def gauge() -> str | None:  # /metrics' gauges follow at the next background refresh
            found = re.search(pattern, httpx.get(base + "/metrics", timeout=60).text)
            return None if found is None else found.group(1)

        wait_progress(lambda: gauge() == "7.0", gauge, what="tally's lag in /metrics", poll=0.5)

        done = _rebuild(base, server, "tally")
        assert done["state"] == "done" and done["stage"] == "done", done
        assert done["table"] == "tally__v1_1", done
        rows = httpx.get(base + "/views/tally", timeout=30).json()["rows"]
        assert {r["code_version"] for r in rows} == {1} and sum(r["n"] for r in rows) == EVENTS, rows

        # the file edited to version 2: the API sees it, and a rebuild runs and labels v2
        tally.write_text(TALLY.format(name="tally", version=2))
        status = _projection(base, "tally")
        assert status["version"] == 2 and status["needs_rebuild"], status
        done = _rebuild(base, server, "tally")
        assert done["state"] == "done" and done["stage"] == "done", done
        assert done["table"] == "tally__v2_2", done
        rows = httpx.get(base + "/views/tally", timeout=30).json()["rows"]
        assert {r["code_version"] for r in rows} == {2}, rows
        after = _projection(base, "tally")
        assert after["build_version"] == 2 and after["lag"] == 0 and not after["needs_rebuild"], after
