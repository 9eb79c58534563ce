"""deploy/: compose and systemd files name real commands and real configuration keys.

No Docker engine runs on the build machines, so the compose file is checked by structure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tributary.api.cli.main import app
from tributary.api.settings.config import Settings

pytestmark = pytest.mark.unit

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _is_config_key(env: str) -> bool:
    """TRIBUTARY_<SECTION>__<KEY> (or a top-level TRIBUTARY_<KEY>) names a settings field."""
    name = env.removeprefix("TRIBUTARY_").lower()
    section, _, key = name.partition("__")
    fields = Settings.model_fields
    if not key:
        return section in fields
    if section not in fields:
        return False
    model = fields[section].annotation
    sub = getattr(model, "model_fields", {})
    return key in sub or any(f.alias == key for f in sub.values())


def _cli_accepts(argv: list[str]) -> bool:
    words = []
    for w in argv[1:]:
        if w.startswith("-"):
            break  # options (and their values) follow the command words
        words.append(w)
    path = words[:2] if words[:1] in (["log"], ["pg"], ["project"], ["capture"]) and len(words) > 1 else words[:1]
    return CliRunner().invoke(app, [*path, "--help"]).exit_code == 0


def test_compose_services_use_real_commands_and_keys() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"postgres", "capture", "api", "projections", "spark-master", "spark-worker"} <= set(services)
    commands, keys = set(), set()
    for name, service in services.items():
        command = service.get("command")
        if command and command[0] == "tributary":
            assert _cli_accepts(command), f"{name}: {command} is not a tributary command"
            commands.add(name)
        for env in service.get("environment", {}):
            if env.startswith("TRIBUTARY_"):
                assert _is_config_key(env), f"{name}: {env} is not a configuration key"
                keys.add(env)
    # the loops above checked something: every tributary service, and the settings they share
    assert commands == {"init", "capture", "api", "projections"}, commands
    assert {"TRIBUTARY_SERVICE__DSN", "TRIBUTARY_LOG__ROOT", "TRIBUTARY_SOURCES"} <= keys, keys
    assert "healthcheck" in services["postgres"] and "healthcheck" in services["api"]


def test_systemd_units_run_real_commands() -> None:
    units = sorted(DEPLOY.glob("systemd/*.service"))
    assert [u.name for u in units] == [  # a missing or renamed unit fails here, not silently
        "tributary-api.service",
        "tributary-capture.service",
        "tributary-projections@.service",
    ]
    for unit in units:
        exec_start = re.search(r"^ExecStart=(\S+) (.*)$", unit.read_text(), re.M)
        assert exec_start, unit.name
        argv = ["tributary", *exec_start.group(2).replace("%i", "account_balances").split()]
        assert _cli_accepts(argv), f"{unit.name}: {argv}"
