"""pyproject.toml's package list and package data agree, as setuptools checks them when it builds
(`pip install`): a data file in a folder whose name Python could import must be in a listed package,
or setuptools prints a 40-line warning ("Package '…' is absent from the `packages` configuration")."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _config() -> dict[str, object]:
    setuptools: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return setuptools


def _folder(package: str, package_dir: dict[str, str]) -> Path:
    """Where a package's files live: the longest mapped prefix of its name, then its own parts."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in package_dir:
            return ROOT / package_dir[prefix] / Path(*parts[n:])
    return ROOT / Path(*parts)


def test_every_data_file_is_in_a_listed_package() -> None:
    config = _config()
    packages = set(config["packages"])  # type: ignore[call-overload]
    package_dir: dict[str, str] = config["package-dir"]  # type: ignore[assignment]
    data: dict[str, list[str]] = config["package-data"]  # type: ignore[assignment]
    for package, patterns in data.items():
        assert package in packages, f"package-data for {package}, which is not in packages"
        folder = _folder(package, package_dir)
        for pattern in patterns:
            files = [f for f in folder.glob(pattern) if f.is_file()]
            assert files, f"{package}: {pattern!r} matches no file in {folder}"
            for f in files:
                sub = f.relative_to(folder).parent.parts
                if sub and all(part.isidentifier() for part in sub):
                    inner = ".".join((package, *sub))
                    assert inner in packages, f"{f.relative_to(ROOT)} is data of {inner}, absent from packages"


def _package_folders() -> dict[str, Path]:
    """Every folder of Python files under the mapped folders, by the package name it installs as."""
    package_dir: dict[str, str] = _config()["package-dir"]  # type: ignore[assignment]
    found: dict[str, Path] = {}
    for package, folder in package_dir.items():
        for py in (ROOT / folder).rglob("*.py"):
            sub = py.parent.relative_to(ROOT / folder).parts
            if all(part.isidentifier() for part in sub):
                found[".".join((package, *sub))] = py.parent
    return found


def test_every_folder_of_code_is_a_listed_package() -> None:
    """setuptools' discovery names a package by its folder, so the list is written out: a folder
    missing from it would be left out of the wheel (and the editable install would still find it)."""
    listed = set(_config()["packages"])  # type: ignore[call-overload]
    found = _package_folders()
    assert {"tributary.capture.decoding", "tributary.consumers", "tributary.migrations.versions"} <= found.keys()
    assert sorted(found.keys() - listed) == []
    assert sorted(p for p in listed - found.keys() if not _folder(p, _config()["package-dir"]).is_dir()) == []  # type: ignore[arg-type]


def test_the_type_check_links_every_mapped_folder() -> None:
    """`make lint` checks the folders it links; one left out would be skipped without a word
    when nothing checked imports it."""
    line = next(ln for ln in (ROOT / "Makefile").read_text().splitlines() if ln.startswith("TYPECHECK_PACKAGES :="))
    linked = set(line.split(":=", 1)[1].split())
    package_dir: dict[str, str] = _config()["package-dir"]  # type: ignore[assignment]
    assert linked == {folder for package, folder in package_dir.items() if package != "tributary"}


def test_mypy_is_strict_for_the_whole_tree() -> None:
    """Strictness is the tree's default, not a list of modules that opted in: a new module is
    checked strictly from its first line. An override may only let an untyped third-party library's
    imports through; none may turn a check off for a module of ours."""
    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert mypy.get("strict") is True
    assert "ignore_missing_imports" not in mypy
    for override in mypy.get("overrides", []):
        modules = override["module"] if isinstance(override["module"], list) else [override["module"]]
        ours = [m for m in modules if m.split(".")[0] in {"tributary", "tributary_client"}]
        assert ours == [], f"an override names modules of the tree: {ours}"
        assert set(override) - {"module"} == {"ignore_missing_imports"}, override
