"""The contract suite: every test here runs once per log backend (tests/backends.py `backend`)."""

from __future__ import annotations

from tests.backends import backend  # noqa: F401  (the fixture each test takes)
