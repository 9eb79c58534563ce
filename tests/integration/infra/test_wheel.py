"""The distribution as a user installs it: one package, `tributary`, that works from a wheel.

The wheel is built from this checkout and installed into a fresh virtual environment. That
environment sees the test environment's third-party packages (a `.pth` line, so no download), but
not this checkout nor its editable install: `tributary` must come from the wheel alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.checkout import clean_copy
from tests.pg import REPO_ROOT
from tests.waiting import run_process

pytestmark = pytest.mark.integration

FOLDERS = ("api", "capture", "consumers", "eventstore", "log", "migrations", "projections", "sinks")


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the checkout stays out of sight
    return run_process(cmd, what=" ".join(cmd[:3]), cwd=cwd, env=env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the wheel, the fresh venv's bin directory). tributary-client, which tributary depends on,
    is built from `client/` and installed beside it, as `pip install ./client .` does."""
    work = tmp_path_factory.mktemp("wheel")
    source = clean_copy(REPO_ROOT, tmp_path_factory.mktemp("checkout"))
    for project in (source, source / "client"):
        built = _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "-q",
                "-w",
                str(work),
                str(project),
            ],
            work,
        )
        assert built.returncode == 0, built.stderr
    (wheel,) = work.glob("tributary-*.whl")
    (client_wheel,) = work.glob("tributary_client-*.whl")
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], work).check_returncode()
    deps = _run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], work)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "test-env-deps.pth").write_text(deps.stdout.strip() + "\n")
    pip = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "--ignore-installed",
            "-q",
            str(client_wheel),
            str(wheel),
        ],
        work,
    )
    assert pip.returncode == 0, pip.stderr
    return wheel, venv / "bin"


def test_the_wheel_holds_one_top_level_package(installed: tuple[Path, Path]) -> None:
    wheel, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"tributary"}
    for data in (
        "tributary/migrations/alembic.ini",
        "tributary/migrations/env.py",
        "tributary/api/http/static/console.html",
    ):
        assert data in names
    assert any(n.startswith("tributary/migrations/versions/") and n.endswith(".py") for n in names)


def test_the_wheel_holds_every_module_of_every_folder(installed: tuple[Path, Path]) -> None:
    """Each mapped folder's Python files, sub-packages included (capture/decoding/, consumers/, …),
    are in the wheel under the name they install as."""
    wheel, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        f"tributary/{py.relative_to(REPO_ROOT)}"
        for folder in FOLDERS
        for py in (REPO_ROOT / folder).rglob("*.py")
        if all(part.isidentifier() for part in py.parent.relative_to(REPO_ROOT).parts)
    }
    expected |= {f"tributary/{py.name}" for py in (REPO_ROOT / "tributary").glob("*.py")}
    assert "tributary/capture/decoding/wal2json.py" in expected and "tributary/sinks/runner.py" in expected
    assert sorted(expected - names) == []


def test_the_installed_cli_runs_from_the_wheel(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, bin_dir = installed
    helped = _run([str(bin_dir / "tributary"), "--help"], tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert "capture" in helped.stdout and "serve" in helped.stdout
    reference = _run([str(bin_dir / "tributary"), "config", "reference"], tmp_path)
    assert reference.returncode == 0, reference.stderr
    assert "[service]" in reference.stdout and "[log]" in reference.stdout


def test_only_tributary_is_importable_and_migrations_come_from_the_package(
    installed: tuple[Path, Path], tmp_path: Path
) -> None:
    _, bin_dir = installed
    probe = (
        "import importlib.util, tributary\n"
        "from tributary.eventstore.migrate import MIGRATIONS, head_revision\n"
        f"print([n for n in {FOLDERS!r} if importlib.util.find_spec(n) is not None])\n"
        "print(tributary.__file__)\n"
        "print(MIGRATIONS)\n"
        "print(head_revision())\n"
        "from tributary.client import Consumer\n"
        "print(Consumer.__module__)\n"
    )
    out = _run([str(bin_dir / "python"), "-c", probe], tmp_path)
    assert out.returncode == 0, out.stderr
    found, package, migrations, head, consumer = out.stdout.splitlines()
    assert found == "[]"  # `import capture`, `import api`, … find nothing of ours
    venv = bin_dir.parent
    assert Path(package).is_relative_to(venv) and Path(migrations).is_relative_to(venv)
    assert head and head != "None"
    assert consumer == "tributary_client._consumer"  # tributary.client re-exports the installed tributary-client
