"""The tributary-client distribution as a consuming service installs it: a wheel built from
`client/`, installed by pip into a fresh virtual environment that holds nothing else.

pip resolves the wheel's own requirements from the package index, pinned to the versions this test
environment has (so the run is repeatable, and pip's cache serves them after the first time); the
environment is built once per session (`tests/client/conftest.py`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import distributions
from pathlib import Path

from packaging.version import InvalidVersion, Version

from tests.checkout import clean_copy
from tests.pg import REPO_ROOT

__all__ = ["CLIENT", "Standalone", "build", "isolated_env", "pins"]

CLIENT = REPO_ROOT / "client"
OURS = {"tributary", "tributary-client"}


@dataclass(frozen=True)
class Standalone:
    """The built wheel and the fresh environment it is installed in."""

    wheel: Path
    python: Path

    def run(self, args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`python ARGS` in the fresh environment, away from this checkout (no PYTHONPATH, another cwd)."""
        return subprocess.run(
            [str(self.python), *args], cwd=cwd, env=isolated_env(), capture_output=True, text=True, timeout=timeout
        )


def isolated_env() -> dict[str, str]:
    """This process's environment without PYTHONPATH (the session puts the checkout there)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _valid(version: str) -> bool:
    """A PEP 440 version (pip refuses a constraints file with any other)."""
    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def pins() -> list[str]:
    """`name==version` of every distribution this test environment imports (the first one found on
    sys.path per name, as imports see them), except the project's own."""
    found: dict[str, str] = {}
    for dist in distributions():
        name = dist.metadata["Name"]
        if name and _normal(name) not in OURS and _valid(dist.version):
            found.setdefault(_normal(name), dist.version)
    return [f"{name}=={version}" for name, version in sorted(found.items())]


def _checked(cmd: list[str], cwd: Path, what: str) -> None:
    done = subprocess.run(cmd, cwd=cwd, env=isolated_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{what} failed:\n{done.stdout}\n{done.stderr}"


def build(work: Path) -> Standalone:
    """`pip wheel --no-deps client/` into `work`, then `pip install` of that wheel alone into a new venv there."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    source = clean_copy(CLIENT, work / "checkout")
    _checked([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work), str(source)], work, "pip wheel")
    (wheel,) = work.glob("tributary_client-*.whl")
    venv = work / "venv"
    _checked([sys.executable, "-m", "venv", "--without-pip", str(venv)], work, "python -m venv")
    constraints = work / "constraints.txt"
    constraints.write_text("\n".join(pins()) + "\n")
    python = venv / "bin" / "python"
    install = [*pip, "--python", str(python), "install", "--only-binary", ":all:", "-c", str(constraints), str(wheel)]
    _checked(install, work, "pip install of the wheel")
    return Standalone(wheel, python)
