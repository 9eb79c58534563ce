"""The CLI starts without the projection stack: `tributary capture` (and every command but
`project` and `demo`) must not pay for pyarrow, numpy, pyspark or httpx at start-up: they would
double capture's resident memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_cli_import_leaves_the_projection_stack_out() -> None:
    heavy = ("pyarrow", "numpy", "pyspark", "httpx", "tributary.projections.runner")
    code = f"import sys; import tributary.api.cli.main; print(','.join(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
