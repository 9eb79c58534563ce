"""Secrets never reach the structured logs: `redact` masks DSN passwords, libpq keyword passwords
(quoted ones included) and bearer tokens."""

from __future__ import annotations

import pytest

from tributary.api.settings.logs import redact

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("connecting to postgresql://app:s3cret@db:5432/shop", "s3cret"),
        ("connecting to postgresql://:s3cret@db/shop", "s3cret"),
        ("dsn host=db password=s3cret user=app", "s3cret"),
        ("dsn host=db password='s3 cr\\'et' user=app", "cr"),
        ("Authorization: Bearer tok3n", "tok3n"),
    ],
)
def test_secrets_are_masked(text: str, secret: str) -> None:
    masked = redact(text)
    assert secret not in masked
    assert "***" in masked


def test_text_without_secrets_is_unchanged() -> None:
    text = "connecting to postgresql://db:5432/shop as app"
    assert redact(text) == text
