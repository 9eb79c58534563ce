"""Counts in CLI output agree with their number: `1 row`, `2 rows`."""

from __future__ import annotations

import pytest

from tributary.api.cli.project import _print_result
from tributary.projections.runner import RunResult

pytestmark = pytest.mark.unit


def test_project_run_says_1_row_and_2_records(capsys: pytest.CaptureFixture[str]) -> None:
    _print_result(RunResult("balances", 3, "balances__v1_3", 2, 1, False, 0.25, 0))
    line = capsys.readouterr().out
    assert "2 records read, 1 row written in " in line, line
    _print_result(RunResult("balances", 3, "balances__v1_3", 1, 0, False, 0.25, 0))
    assert "1 record read, 0 rows written" in capsys.readouterr().out
