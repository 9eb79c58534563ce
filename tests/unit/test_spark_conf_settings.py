"""`[projections] spark_conf`: a table of strings from the file or the environment, carried into
the run settings, its secrets masked by `config show`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tributary.api.settings.config import Settings, load_settings
from tributary.api.settings.masking import MASK, masked
from tributary.projections.runner import RunSettings

pytestmark = pytest.mark.unit

CONF = {
    "spark.driver.host": "driver.example",
    "spark.driver.port": "7078",
    "spark.authenticate.secret": "s3cret",
    "spark.hadoop.fs.s3a.access.key": "AKIAKEY",
    "spark.hadoop.fs.s3a.secret.key": "hush",
    "spark.ssl.keyPassword": "pw",
}


def test_spark_conf_from_file_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tributary.toml"
    path.write_text('[projections]\nspark_master = "spark://m:7077"\nspark_conf = { "spark.driver.host" = "a" }\n')
    assert load_settings(path).projections.spark_conf == {"spark.driver.host": "a"}
    monkeypatch.setenv("TRIBUTARY_PROJECTIONS__SPARK_CONF", json.dumps(CONF))
    s = RunSettings.from_settings(load_settings(path), dsn="postgresql://h/db")
    assert dict(s.spark_conf) == CONF  # the environment wins, whole
    assert s.spark_master == "spark://m:7077"


def test_spark_conf_values_must_be_strings() -> None:
    with pytest.raises(ValueError, match="spark_conf"):
        Settings(projections={"spark_conf": {"spark.executor.cores": {"nested": 1}}})  # type: ignore[arg-type]


def test_config_show_masks_spark_secrets_only() -> None:
    shown = masked(Settings(projections={"spark_conf": CONF}))["projections"]["spark_conf"]  # type: ignore[arg-type]
    secret = {k for k in CONF if any(w in k.lower() for w in ("secret", "password", "access.key"))}
    assert secret == {
        "spark.authenticate.secret",
        "spark.hadoop.fs.s3a.access.key",
        "spark.hadoop.fs.s3a.secret.key",
        "spark.ssl.keyPassword",
    }
    assert {k for k, v in shown.items() if v == MASK} == secret
    assert {k: v for k, v in shown.items() if k not in secret} == {
        "spark.driver.host": "driver.example",
        "spark.driver.port": "7078",
    }
