"""The Alembic scripts as files: numbered in the order they run, and free of the project's own code.

A database in the field stores a revision id, never a file name, so file names may be renumbered;
ids may not. A migration that imports live code changes meaning when that code changes later, so each
one carries the constants it needs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.pg import REPO_ROOT

pytestmark = pytest.mark.unit

VERSIONS = REPO_ROOT / "migrations" / "versions"
_NAME = re.compile(r"(\d{4})_[a-z0-9_]+\.py")


def _scripts() -> list[Path]:
    found = sorted(p for p in VERSIONS.glob("*.py") if p.name != "__init__.py")
    assert found, f"no migrations under {VERSIONS}"
    return found


def _assigned(path: Path, name: str) -> str | None:
    """The constant a script assigns to `name` at module level (`revision`, `down_revision`)."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = ast.literal_eval(node.value)
            assert value is None or isinstance(value, str), f"{path.name}: {name} is not one revision id"
            return value
    raise AssertionError(f"{path.name} assigns no {name}")


def _run_order() -> list[str]:
    """The file names in the order Alembic runs them: from the base down the `down_revision` chain."""
    by_parent: dict[str | None, list[str]] = {}
    names = {}
    for path in _scripts():
        by_parent.setdefault(_assigned(path, "down_revision"), []).append(path.name)
        names[path.name] = _assigned(path, "revision")
    order: list[str] = []
    parent: str | None = None
    while parent in by_parent:
        children = by_parent.pop(parent)
        assert len(children) == 1, f"revision {parent!r} has more than one child: {children} (a branch)"
        order.append(children[0])
        parent = names[children[0]]
    assert not by_parent, f"scripts off the chain from the base: {sorted(by_parent.values())}"
    return order


def test_the_files_are_numbered_0001_up_in_the_order_they_run() -> None:
    order = _run_order()
    bad = [p.name for p in _scripts() if not _NAME.fullmatch(p.name)]
    assert not bad, f"not named NNNN_words.py: {bad}"
    numbers = [int(name[:4]) for name in order]
    assert numbers == list(range(1, len(order) + 1)), f"run order {order}: numbers not 1, 2, 3, … each once"


def test_the_revision_ids_databases_store_are_kept() -> None:
    """`eventstore.alembic_version` holds one of these in every database in the field: renumbering a
    file must not touch them."""
    ids = [_assigned(VERSIONS / name, "revision") for name in _run_order()]
    assert (
        ids
        == [
            "0001",
            "0002",
            "0003_es_xact",
            "0003_consumer_groups",
            "0004_sinks",
            "0005_consumer_nacks",
            "0006_stream_lifecycle",
            "0007_subject_keys",
            "0008_snapshot_keys",
            "0009_removed_at",
        ][: len(ids)]
    )


def test_no_migration_imports_tributary() -> None:
    offenders = []
    for path in _scripts():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = ["." if node.level else node.module or ""]
            offenders += [
                f"{path.name}:{node.lineno} {m}" for m in modules if m == "." or m.split(".")[0] == "tributary"
            ]
    assert not offenders, f"migrations import live code (copy the constants in instead): {offenders}"
