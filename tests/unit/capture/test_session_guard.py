"""capture/database/session_guard.py: the session settings asked of a source server, by its version."""

from __future__ import annotations

import pytest

from tributary.capture.database.session_guard import server_settings

pytestmark = pytest.mark.unit


def test_only_a_server_that_has_it_is_asked_to_check_its_client() -> None:
    assert "client_connection_check_interval" in server_settings(150004, statement_timeout_ms=None)
    assert "client_connection_check_interval" not in server_settings(130011, statement_timeout_ms=None)
    assert "statement_timeout" not in server_settings(150004, statement_timeout_ms=None)
    assert server_settings(100000, statement_timeout_ms=5000)["statement_timeout"] == "5000ms"
