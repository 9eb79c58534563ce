"""The benchmarks of capture and the log measure the compiled twins: on the pure-Python fallback
(not built, or `TRIBUTARY_IMPL=python`) they stop with one line unless told `--allow-python`."""

from __future__ import annotations

import argparse
import sys

from tributary.impl import selection


def add_allow_python(parser: argparse.ArgumentParser) -> None:
    """The flag that lets a benchmark measure the fallback on purpose (an A/B of the two)."""
    parser.add_argument(
        "--allow-python",
        action="store_true",
        help="measure even when the typed twins run as pure Python (not built, or TRIBUTARY_IMPL=python)",
    )


def require_compiled(allow_python: bool) -> str:
    """Which implementation runs (as `tributary --version` says it), for the results; exits with
    one line when it is not the compiled one and the fallback was not allowed."""
    chosen = selection()
    if chosen.name != "compiled" and not allow_python:
        sys.exit(
            f"bench: the typed twins would run as pure Python ({chosen}), which this benchmark does not "
            "measure unless told: build them (`make setup`), unset TRIBUTARY_IMPL, or pass --allow-python"
        )
    return str(chosen)
