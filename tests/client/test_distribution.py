"""tributary-client is a distribution of its own, checked from the source: it imports nothing but
the standard library, httpx and orjson; tributary depends on it, every install of tributary from
this checkout installs `client/` with it, tributary's code imports it by its own name, and
`tributary.client` still re-exports it for existing code."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest
import tributary_client

import tributary.client
from tests.client.standalone import CLIENT
from tests.pg import REPO_ROOT

pytestmark = pytest.mark.unit

ALLOWED = {"httpx", "orjson", "tributary_client"}
PRODUCT = ("tributary", "api", "capture", "eventstore", "migrations", "projections", "bench", "tests")
RE_EXPORT_TEST = Path(__file__).resolve()


def _imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of each absolute import in `path`, wherever it stands; `from m import n` gives
    both `m` and `m.n` (so `from tributary import client` is seen)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.lineno, node.module
            yield from ((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)


def _requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group()).lower()


def test_the_client_imports_only_the_standard_library_httpx_and_orjson() -> None:
    files = sorted((CLIENT / "tributary_client").rglob("*.py"))
    assert files
    bad = [
        f"{path.relative_to(REPO_ROOT)}:{line}: {module}"
        for path in files
        for line, module in _imported(path)
        if module.split(".")[0] not in ALLOWED | set(sys.stdlib_module_names)
    ]
    assert bad == []


def test_the_client_distribution_requires_httpx_and_orjson_only() -> None:
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "tributary-client"
    assert project["requires-python"] == ">=3.11"
    assert sorted(_requirement_name(r) for r in project["dependencies"]) == ["httpx", "orjson"]


def test_the_client_has_its_own_version() -> None:
    config = tomllib.loads((CLIENT / "pyproject.toml").read_text())
    assert "version" in config["project"]["dynamic"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "tributary_client.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", tributary_client.__version__)
    assert version("tributary-client") == tributary_client.__version__  # what `make setup` installed is this checkout's


def test_tributary_depends_on_the_client() -> None:
    dependencies = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "tributary-client" in {_requirement_name(r) for r in dependencies}


def _installs_of_the_project(text: str) -> list[str]:
    """The `pip install` (or, for an image, `pip wheel`) command lines of `text` that install or
    build this checkout (`.`, `'.[test]'`, …)."""
    return [
        line
        for line in text.splitlines()
        if re.search(r"\bpip (?:install|wheel)\b", line)
        and re.search(r"""(?:^|\s)(?:-e\s+)?['"]?\.(?:\[[\w,]+\])?['"]?(?:\s|$)""", line)
    ]


def test_every_install_of_the_project_installs_client_first() -> None:
    """tributary-client comes from this checkout, not from the index: wherever the project is
    installed, `./client` is named in the same pip command, before the project."""
    for name in ("Makefile", "deploy/Dockerfile"):
        lines = _installs_of_the_project((REPO_ROOT / name).read_text())
        assert lines, f"{name} no longer installs the project"
        for line in lines:
            assert re.search(r"\./client\b.*\s['\"]?\.", line), (
                f"{name}: {line.strip()!r} does not install ./client first"
            )


def test_install_lines_are_found() -> None:
    found = _installs_of_the_project(
        "\tpip install -q -e '.[test]'\nRUN pip install --no-cache-dir .\npip install ./client\n"
    )
    assert found == ["\tpip install -q -e '.[test]'", "RUN pip install --no-cache-dir ."]


def test_tributary_client_module_re_exports_the_client() -> None:
    names = [n for n in tributary_client.__all__ if n != "__version__"]
    assert sorted(tributary.client.__all__) == sorted(names)
    for name in names:
        assert getattr(tributary.client, name) is getattr(tributary_client, name), name


def test_the_product_imports_the_client_by_its_own_name() -> None:
    """Only the re-export module (and its test) import `tributary.client`: the rest of the code
    says `tributary_client`, the distribution it really comes from."""
    bad = [
        f"{path.relative_to(REPO_ROOT)}:{line}: {module}"
        for folder in PRODUCT
        for path in sorted((REPO_ROOT / folder).rglob("*.py"))
        if path.resolve() != RE_EXPORT_TEST
        for line, module in _imported(path)
        if module == "tributary.client" or module.startswith("tributary.client.")
    ]
    assert bad == []
