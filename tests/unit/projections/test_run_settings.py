"""Run settings from `tributary.toml`: a run needs the service database it keeps its views in."""

from __future__ import annotations

from pathlib import Path

import pytest

from tributary.api.settings.config import load_settings
from tributary.projections.errors import RunError
from tributary.projections.runner import RunSettings

pytestmark = pytest.mark.unit


def test_without_a_service_dsn_the_error_names_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIBUTARY_SERVICE__DSN", raising=False)
    path = tmp_path / "tributary.toml"
    path.write_text("[projections]\nmodules = []\n")
    settings = load_settings(path)
    assert not settings.service.dsn
    with pytest.raises(RunError, match=r"set \[service\] dsn"):
        RunSettings.from_settings(settings)
    assert RunSettings.from_settings(settings, dsn="postgresql://h/db").dsn == "postgresql://h/db"
