"""The log is a lower layer with a public API: read from the source tree's imports (AST).

Outside the layer (`log/`), the package code reaches the log through `tributary.log` (its
`__all__`: contracts, openers, shared types), naming a backend only where a part of it is that
backend's by nature (listed below, each with its reason). Outside `log/local`, the package code
imports only `tributary.log.local` (its `__all__`) and its admin operations (`tributary.log.local.admin`). That the log imports no layer above it, that
the local backend imports nothing else, and that nothing imports in a cycle, tests/unit/test_layout.py
holds.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import tributary.log as layer_api
import tributary.log.local as log_api

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
LOG = "tributary.log.local"
PUBLIC = {LOG, f"{LOG}.admin", *(f"{LOG}:{name}" for name in log_api.__all__)}


def _modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name (pyproject's package-dir mapping)."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    out: dict[str, Path] = {}
    for package in config["packages"]:
        folder = REPO / config["package-dir"].get(package, package.replace(".", "/"))
        if package not in config["package-dir"]:  # a sub-package lives under its parent's folder
            parent, _, leaf = package.rpartition(".")
            folder = REPO / config["package-dir"].get(parent, parent.replace(".", "/")) / leaf
        for f in folder.glob("*.py"):
            out[package if f.stem == "__init__" else f"{package}.{f.stem}"] = f
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """(module imported, line) for each import in the file: for `from a import b`, `a.b` when
    b is a module, else `a` (then also `a:b`, the name taken from it); relative imports are
    resolved against `name`."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                module = f"{base}.{alias.name}"
                if module in MODULES:
                    yield module, node.lineno
                else:
                    yield base, node.lineno
                    yield f"{base}:{alias.name}", node.lineno


def test_the_scan_sees_the_package() -> None:
    assert f"{LOG}.log" in MODULES and "tributary.projections.source" in MODULES
    assert "tributary.api.http.metrics" in MODULES and "tributary.capture.daemon" in MODULES


def test_outside_the_log_only_its_public_api_is_imported() -> None:
    wrong = [
        f"{path.relative_to(REPO)}:{line} imports {imported}"
        for name, path in MODULES.items()
        if not name.startswith(f"{LOG}.") and name != LOG
        for imported, line in _imports(name, path)
        if imported.startswith((f"{LOG}.", f"{LOG}:"))
        and imported not in PUBLIC
        and not imported.startswith(f"{LOG}.admin:")
    ]
    assert wrong == []


def test_the_public_api_is_all_there() -> None:
    for name in log_api.__all__:
        assert getattr(log_api, name) is not None, name


LAYER = "tributary.log"
LAYER_PUBLIC = {LAYER, *(f"{LAYER}:{name}" for name in layer_api.__all__)}
# module outside the layer -> the backend modules it may name, and why
BACKEND_BY_NATURE: dict[str, tuple[str, ...]] = {
    # `log compact`: compacting segments now is the local log's own operation (Kafka's broker compacts)
    "tributary.api.cli.log": ("tributary.log.local.admin",),
    # the developer's broker (`tributary kafka up`) is Kafka's by nature
    "tributary.api.devkafka.embedded": ("tributary.log.kafka",),
    # Spark reads each backend its own way: byte-range splits of local segments, offset ranges of Kafka
    "tributary.projections.source": ("tributary.log.local",),
    "tributary.projections.kafka_source": ("tributary.log.kafka",),
    "tributary.projections.spark_kafka_source": ("tributary.log.kafka",),
    # a columnar snapshot pre-encodes Arrow columns as the local log's lines (Kafka's writer takes them too)
    "tributary.capture.snapshot.initial": ("tributary.log.local",),  # its `encode_columns` only
    # the one selector of compiled twins names each twin's module
    "tributary.impl": ("tributary.log.local._typed",),
}


def test_outside_the_layer_no_backend_is_named_but_by_nature() -> None:
    wrong = [
        f"{path.relative_to(REPO)}:{line} imports {imported}"
        for name, path in MODULES.items()
        if name != LAYER and not name.startswith(f"{LAYER}.")
        for imported, line in _imports(name, path)
        if imported.startswith((f"{LAYER}.", f"{LAYER}:"))
        and imported not in LAYER_PUBLIC
        and not imported.startswith(BACKEND_BY_NATURE.get(name, ("\0",)))
    ]
    assert wrong == []
