"""`docker compose config` accepts deploy/compose.yaml (variables substituted, anchors and merges
resolved, every reference checked by Compose itself). Runs where Docker Compose is installed;
skipped elsewhere, with the reason."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.waiting import run_process

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _no_compose() -> str | None:
    """Why `docker compose config` cannot run here, or None when it can (it needs the Compose
    plugin, not a running engine)."""
    if shutil.which("docker") is None:
        return "no docker command on this machine"
    version = run_process(["docker", "compose", "version"], what="docker compose version")
    if version.returncode != 0:
        return "the docker command here has no Compose plugin (`docker compose version` fails)"
    return None


def test_docker_compose_config_accepts_the_file() -> None:
    why = _no_compose()
    if why is not None:
        pytest.skip(why)
    out = run_process(
        ["docker", "compose", "-f", str(DEPLOY / "compose.yaml"), "config", "--quiet"],
        what="docker compose config",
        env={**os.environ, "TRIBUTARY_API_KEY": "k" * 32},
    )
    assert out.returncode == 0, out.stderr
