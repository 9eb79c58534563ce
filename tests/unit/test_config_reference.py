"""The README's configuration block is exactly the generated reference, and it loads."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tributary.api.settings.config import Settings
from tributary.api.settings.reference import reference

pytestmark = pytest.mark.unit

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_block_is_the_generated_reference() -> None:
    text = README.read_text()
    start = text.index("```toml\npg_data_dir") + len("```toml\n")
    assert text[start : text.index("```", start)] == reference()


def test_reference_is_valid_toml_that_validates() -> None:
    data = tomllib.loads(reference())
    settings = Settings(**data)
    assert settings.sources[0].name == "shop" and settings.log.partitions == 4
