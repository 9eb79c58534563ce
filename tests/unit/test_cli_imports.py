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


def test_cli_import_leaves_the_kafka_client_out() -> None:
    """confluent-kafka (librdkafka) loads only when a Kafka log is built, not for the settings,
    the CLI or capture's modules that merely name the Kafka log in types."""
    modules = ("tributary.api.cli.main", "tributary.api.settings.log", "tributary.capture.daemon")
    code = "import sys; " + "; ".join(f"import {m}" for m in modules)
    code += "; print(','.join(m for m in sys.modules if m.split('.')[0] == 'confluent_kafka'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
