"""The suite refuses a test module without a level marker (tests/markers.py), even under `-m`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.pg import REPO_ROOT
from tests.waiting import run_process

pytestmark = pytest.mark.unit

INI = """[pytest]
markers =
    unit: u
    integration: i
    e2e: e
    slow: s
addopts = --strict-markers -p no:cacheprovider
"""

MARKED = "import pytest\n\npytestmark = pytest.mark.unit\n\n\ndef test_a() -> None:\n    pass\n"
PER_TEST = "import pytest\n\n\n@pytest.mark.integration\ndef test_b() -> None:\n    pass\n"
UNMARKED = "def test_c() -> None:\n    pass\n"
SLOW_ONLY = "import pytest\n\npytestmark = pytest.mark.slow\n\n\ndef test_d() -> None:\n    pass\n"


def _collect(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (root / "pytest.ini").write_text(INI)
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "tests.markers",
        "-c",
        str(root / "pytest.ini"),
        "--rootdir",
        str(root),
    ]
    return run_process([*cmd, "--collect-only", "-q", *args, str(root)], what="pytest --collect-only", cwd=REPO_ROOT)


def test_marked_modules_pass(tmp_path: Path) -> None:
    (tmp_path / "test_marked.py").write_text(MARKED)
    (tmp_path / "test_per_test.py").write_text(PER_TEST)
    res = _collect(tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 tests collected" in res.stdout, res.stdout


@pytest.mark.parametrize("select", [[], ["-m", "unit"]])
def test_an_unmarked_module_stops_the_run(tmp_path: Path, select: list[str]) -> None:
    (tmp_path / "test_marked.py").write_text(MARKED)
    (tmp_path / "test_unmarked.py").write_text(UNMARKED)
    (tmp_path / "test_slow_only.py").write_text(SLOW_ONLY)
    res = _collect(tmp_path, *select)
    assert res.returncode == pytest.ExitCode.USAGE_ERROR, res.stdout + res.stderr
    (error,) = [line for line in (res.stdout + res.stderr).splitlines() if "without a level marker" in line]
    assert error.endswith(": test_slow_only.py, test_unmarked.py"), error
