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
