"""The client's fixtures: its wheel installed alone in a fresh environment, built once per session."""

from __future__ import annotations

import pytest

from tests.client.standalone import Standalone, build


@pytest.fixture(scope="session")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Standalone:
    """The tributary-client wheel, pip-installed alone into a new venv (see `tests.client.standalone`)."""
    return build(tmp_path_factory.mktemp("client-standalone"))
