"""A pytest plugin that refuses a run in which some test has no level marker (unit, integration
or e2e): such a test is silently left out of every `-m` selection, so it would never run in CI's
marked runs. `tests/conftest.py` loads it for the whole suite."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

__all__ = ["LEVELS", "pytest_collection_modifyitems", "unmarked_modules"]

LEVELS = frozenset({"unit", "integration", "e2e"})


def unmarked_modules(items: Iterable[pytest.Item]) -> list[str]:
    """The files (as pytest names them) holding a test that carries none of `LEVELS`."""
    return sorted(
        {item.nodeid.split("::", 1)[0] for item in items if not LEVELS & {m.name for m in item.iter_markers()}}
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects the very tests this looks for
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Stop the run, naming the modules, when a collected test has no level marker."""
    missing = unmarked_modules(items)
    if missing:
        raise pytest.UsageError(
            "test modules without a level marker (add `pytestmark = pytest.mark.unit`, `.integration` or `.e2e`): "
            + ", ".join(missing)
        )
