"""`tributary sinks …` when something is missing: one line on stderr, exit 1, no secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.capture.helpers import cli
from tributary.api.devdb.embedded import free_port

pytestmark = pytest.mark.integration

SINK = '[[sinks]]\ntype = "http"\nname = "hook"\nurl = "http://127.0.0.1:9/in"\ntopics = ["t"]\n'


def _config(tmp_path: Path, dsn: str, sinks: str = SINK) -> str:
    path = tmp_path / "t.toml"
    path.write_text(f'[service]\ndsn = "{dsn}"\n[log]\nroot = "{tmp_path / "log"}"\n{sinks}')
    return str(path)


def _one_line(args: list[str]) -> str:
    out = cli(*args)
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def test_sinks_commands_before_init_and_without_sinks(fresh_db: str, tmp_path: Path) -> None:
    config = _config(tmp_path, fresh_db)
    assert "tributary init" in _one_line(["sinks", "run", "--config", config])
    assert "tributary init" in _one_line(["sinks", "status", "--config", config])
    assert "tributary init" in _one_line(["sinks", "dead-letters", "hook", "--config", config])
    assert "no sink named nope" in _one_line(["sinks", "run", "--name", "nope", "--config", config])
    bare = _config(tmp_path, fresh_db, sinks="")
    assert "no [[sinks]] configured" in _one_line(["sinks", "run", "--config", bare])


def test_an_unreachable_database_is_one_line_without_the_password(tmp_path: Path) -> None:
    config = _config(tmp_path, f"postgresql://u:s3cret@127.0.0.1:{free_port()}/x")
    for args in (["sinks", "run"], ["sinks", "status"], ["sinks", "dead-letters", "hook"]):
        line = _one_line([*args, "--config", config])
        assert "cannot reach the service database" in line and "s3cret" not in line
