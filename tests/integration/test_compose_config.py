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


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    why = _no_compose()
    if why is not None:
        pytest.skip(why)
    deploy = tmp_path / "deploy"  # a copy, with the secret files generate.sh makes (never in the checkout)
    shutil.copytree(DEPLOY, deploy, ignore=shutil.ignore_patterns("secrets"))
    (deploy / "secrets").mkdir()
    shutil.copy(DEPLOY / "secrets" / "generate.sh", deploy / "secrets" / "generate.sh")
    made = run_process(["sh", str(deploy / "secrets" / "generate.sh")], what="deploy/secrets/generate.sh")
    assert made.returncode == 0, made.stderr
    out = run_process(
        ["docker", "compose", "-f", str(deploy / "compose.yaml"), "config", "--quiet"],
        what="docker compose config",
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr
