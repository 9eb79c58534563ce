"""Run settings from `tributary.toml`: a run needs the service database it keeps its views in."""

from __future__ import annotations

from pathlib import Path

import pytest

from tributary.api.settings.config import load_settings
from tributary.api.settings.errors import ConfigError
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


def test_cluster_keys_reach_the_run(tmp_path: Path) -> None:
    path = tmp_path / "tributary.toml"
    path.write_text(
        '[projections]\nshuffle_partitions = 12\nexecutor_dsn = "postgresql://tributary@10.0.0.5/tributary"\n'
        "executor_timeout_s = 30\n"
    )
    s = RunSettings.from_settings(load_settings(path), dsn="postgresql://h/db")
    assert (s.shuffle_partitions, s.executor_dsn, s.executor_timeout_s) == (
        12,
        "postgresql://tributary@10.0.0.5/tributary",
        30.0,
    )
    path.write_text("[projections]\nmodules = []\n")
    s = RunSettings.from_settings(load_settings(path), dsn="postgresql://h/db")
    assert (s.shuffle_partitions, s.executor_dsn) == (None, None)  # sized from the cluster; the service DSN


def test_a_bad_shuffle_partitions_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "tributary.toml"
    path.write_text("[projections]\nshuffle_partitions = 0\n")
    with pytest.raises(ConfigError, match=r"\[projections\] shuffle_partitions: must be between 1 and 100000, got 0"):
        load_settings(path)


def test_driver_read_records_reaches_the_run_and_a_bad_one_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "tributary.toml"
    path.write_text("[projections]\nmodules = []\n")
    assert RunSettings.from_settings(load_settings(path), dsn="postgresql://h/db").driver_read_records == 100_000
    path.write_text("[projections]\ndriver_read_records = 0\n")
    assert RunSettings.from_settings(load_settings(path), dsn="postgresql://h/db").driver_read_records == 0
    path.write_text("[projections]\ndriver_read_records = -1\n")
    with pytest.raises(ConfigError, match=r"\[projections\] driver_read_records: must be between 0 and 10000000"):
        load_settings(path)
