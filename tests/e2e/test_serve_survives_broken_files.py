"""`tributary serve` while the user edits their files: a projection file or a domain module saved
with a syntax error never takes the served definitions down (no 500: the last good ones are served,
the broken file and its one-line error are shown in `/projections`, `/healthz` and the console),
and domain modules added to the config are served without a restart."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.servers import free_port, serving
from tests.waiting import wait_progress
from tributary.eventstore.migrate import run_migrations

pytestmark = pytest.mark.e2e

TALLY = """
from tributary.projections.definition import Fold, Projection, Table

PROJECTION = Projection(
    name="{name}",
    version=1,
    topics=("events.tally",),
    table=Table.of({{"stream": "text", "n": "bigint"}}, ["stream"]),
    fold=Fold(initial=lambda k: {{"stream": k, "n": 0}}, apply=lambda s, r: {{**s, "n": s["n"] + 1}}, result=dict),
)
"""

DOMAIN = "from tests.domains.tally import make_tally\n\nAGGREGATE = make_tally()\n"
BROKEN_DOMAIN = "from tests.domains.tally import make_tally\n\nAGGREGATE = make_tally(\n"

BROKEN = "from tributary.projections.definition import Projection\nPROJECTION = Projection(\n"


def _config(path: Path, dsn: str, root: Path, port: int, projections: list[Path], domains: list[Path]) -> None:
    def listed(paths: list[Path]) -> str:
        return ", ".join(f'"{p}"' for p in paths)

    path.write_text(
        f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{root}"\n'
        f"[projections]\nmodules = [{listed(projections)}]\n"
        f"[eventstore]\nmodules = [{listed(domains)}]\n"
        f"[api]\nport = {port}\n"
    )
    time.sleep(0.01)  # a later mtime on file systems with coarse timestamps


def _until(fetch: Callable[[], Any], ok: Callable[[Any], bool], what: str) -> Any:
    """Poll `fetch()` until `ok` says yes (the API looks at the files at most once a second), while
    what it answers changes."""
    got: list[Any] = []

    def done() -> bool:
        got[:] = [fetch()]
        return ok(got[0])

    def seen() -> str:
        answer = got[0] if got else None
        return f"{answer.status_code} {answer.text}" if isinstance(answer, httpx.Response) else repr(answer)

    wait_progress(done, seen, what=what, poll=0.2)
    return got[0]


def _get(base: str, path: str) -> httpx.Response:
    r = httpx.get(base + path, timeout=60)
    assert r.status_code < 500, (path, r.status_code, r.text)
    return r


def _add(base: str, stream: str) -> httpx.Response:
    return httpx.post(f"{base}/commands/tally/{stream}", json={"type": "add", "data": {"n": 2}}, timeout=30)


def test_domain_modules_added_or_broken_while_serving(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    domain, config = tmp_path / "domain.py", tmp_path / "t.toml"
    port = free_port()
    _config(config, fresh_db, tmp_path / "log", port, [], [])
    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        # no domain module yet: the answer says where they are configured, and that no restart is needed
        none = _add(base, "t-1")
        assert none.status_code == 404 and str(config) in none.json()["detail"], none.text
        assert "[eventstore] modules" in none.json()["detail"]

        # a domain module added to the config: served without a restart
        domain.write_text(DOMAIN)
        _config(config, fresh_db, tmp_path / "log", port, [], [domain])
        added = _until(lambda: _add(base, "t-1"), lambda r: r.status_code == 200, "the new domain module")
        assert added.json()["version"] == 1
        paths = _get(base, "/openapi.json").json()["paths"]
        assert "/commands/tally/{stream_id}" in paths, sorted(paths)

        # the domain module saved half-way: commands still served by its last good aggregate
        domain.write_text(BROKEN_DOMAIN)
        health = _until(
            lambda: _get(base, "/healthz").json(),
            lambda h: "[eventstore] modules" in h.get("problems", {}),
            "/healthz",
        )
        assert f"{domain}: line " in health["problems"]["[eventstore] modules"], health
        assert _add(base, "t-1").json()["version"] == 2

        # the config file saved half-way: its last good settings are served, the problem shown
        domain.write_text(DOMAIN)
        good = config.read_text()
        config.write_text(good + "[api\n")
        health = _until(lambda: _get(base, "/healthz").json(), lambda h: "config" in h.get("problems", {}), "config")
        assert health["problems"]["config"].startswith(f"{config} does not load"), health
        assert _add(base, "t-1").json()["version"] == 3

        # fixed: the problems go away
        config.write_text(good)
        _until(lambda: _get(base, "/healthz").json(), lambda h: "problems" not in h, "/healthz without problems")


def test_a_projection_file_saved_half_way_while_serving(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    tally, config = tmp_path / "tally.py", tmp_path / "t.toml"
    tally.write_text(TALLY.format(name="tally"))
    port = free_port()
    _config(config, fresh_db, tmp_path / "log", port, [tally], [])
    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        assert [r["name"] for r in _get(base, "/projections").json()] == ["tally"]

        # the last good definition is served, the error shown
        tally.write_text(BROKEN)
        rows = _until(
            lambda: _get(base, "/projections").json(), lambda rows: rows[0].get("problem") is not None, "/projections"
        )
        assert rows[0]["name"] == "tally" and rows[0]["module"] == str(tally), rows
        problem = rows[0]["problem"]
        assert problem.startswith(f"{tally}: line ") and "SyntaxError" in problem and "\n" not in problem, problem
        assert "not been built yet" in _get(base, "/views/tally").json()["detail"]
        assert [v["name"] for v in _get(base, "/views").json()] == ["tally"]
        health = _get(base, "/healthz").json()
        assert problem in health["problems"]["[projections] modules"], health
        rebuild = httpx.post(base + "/projections/tally/rebuild", timeout=30)
        assert rebuild.status_code == 409 and rebuild.json()["code"] == "projection_not_loadable", rebuild.text

        # a file that never loaded: a row of its own
        other = tmp_path / "other.py"
        other.write_text(BROKEN)
        _config(config, fresh_db, tmp_path / "log", port, [tally, other], [])
        rows = _until(lambda: _get(base, "/projections").json(), lambda rows: len(rows) == 2, "the other file")
        assert rows[1]["name"] is None and rows[1]["module"] == str(other) and rows[1]["state"] == "not loadable"
        assert "SyntaxError" in rows[1]["problem"]

        # fixed: the problems go away
        tally.write_text(TALLY.format(name="tally"))
        _config(config, fresh_db, tmp_path / "log", port, [tally], [])
        _until(lambda: _get(base, "/healthz").json(), lambda h: "problems" not in h, "/healthz without problems")
        assert _get(base, "/projections").json()[0]["problem"] is None


def test_a_projection_file_broken_from_the_start_is_no_500(fresh_db: str, tmp_path: Path) -> None:
    run_migrations(fresh_db)
    broken, config = tmp_path / "broken.py", tmp_path / "t.toml"
    broken.write_text(BROKEN)
    port = free_port()
    _config(config, fresh_db, tmp_path / "log", port, [broken], [])
    with serving(config, port, err_path=tmp_path / "serve.err") as base:
        assert _get(base, "/views/broken").json()["code"] == "unknown_view"
        assert _get(base, "/views").json() == []
        rows = _get(base, "/projections").json()
        assert [(r["name"], r["module"], r["state"]) for r in rows] == [(None, str(broken), "not loadable")]
        assert "SyntaxError" in _get(base, "/healthz").json()["problems"]["[projections] modules"]
