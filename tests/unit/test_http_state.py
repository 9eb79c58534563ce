"""The HTTP routes declare what they use of the app's state: they read it only through the typed
accessors of `api/http/state.py` (dependencies, or awaited by the hot routes), so mypy knows each
piece's type; and the app's factory is the one place that puts state on the app."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.pg import REPO_ROOT

pytestmark = pytest.mark.unit

HTTP = REPO_ROOT / "api" / "http"
WRITER = "app.py"  # create_app and its lifespan
READERS = {
    "state.py": "the typed accessors",
    WRITER: "puts the state on the app",
    "domains.py": "the OpenAPI document follows the served aggregates (no request: the app itself)",
}


def _is_app_state(node: ast.AST) -> bool:
    """`app.state` or `<anything>.app.state`."""
    if not (isinstance(node, ast.Attribute) and node.attr == "state"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id == "app") or (
        isinstance(owner, ast.Attribute) and owner.attr == "app"
    )


def _uses(path: Path) -> tuple[list[int], list[int]]:
    """(lines that read `app.state`, lines that set an attribute on it)."""
    reads, writes = [], []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if _is_app_state(node):
            reads.append(node.lineno)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_app_state(node.value):
            writes.append(node.lineno)
    return reads, writes


def test_routes_read_the_app_state_only_through_its_typed_accessors() -> None:
    bad = [f"{p.name}:{line}" for p in sorted(HTTP.glob("*.py")) if p.name not in READERS for line in _uses(p)[0]]
    assert not bad, f"read `app.state` through api/http/state.py instead: {bad}"


def test_only_the_app_factory_puts_state_on_the_app() -> None:
    bad = [f"{p.name}:{line}" for p in sorted(HTTP.glob("*.py")) if p.name != WRITER for line in _uses(p)[1]]
    assert not bad, f"state put on the app outside {WRITER}: {bad}"
