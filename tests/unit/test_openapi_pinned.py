"""The OpenAPI document, pinned byte for byte: a refactoring of the routes must not change what
clients generate code from. When a change to the document is meant, write it again with
`python -m tests.unit.test_openapi_pinned` and review the diff."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tributary.api.http.app import create_app
from tributary.api.settings.config import EventStoreSettings, Settings

pytestmark = pytest.mark.unit

PINNED = Path(__file__).parents[1] / "fixtures" / "openapi" / "tally.json"


def document() -> str:
    """The document of an app serving the test domain (never started: no database)."""
    settings = Settings(eventstore=EventStoreSettings(modules=("tests.domains.tally",)))
    app = create_app(settings, dsn="postgresql://unused.invalid/none")
    return json.dumps(app.openapi(), indent=1, ensure_ascii=False) + "\n"


def test_the_openapi_document_is_the_pinned_one() -> None:
    assert document() == PINNED.read_text(encoding="utf-8")


if __name__ == "__main__":
    PINNED.write_text(document(), encoding="utf-8")
