"""The command route's metrics: `tributary_commands_total` and `tributary_command_seconds` count every
command under its stream type (a type the handler does not know is "other") and outcome, and the
labelled series are looked up once per (type, outcome), not once per command."""

from __future__ import annotations

import cProfile
import pstats

import pytest

from tributary.api.http import metrics
from tributary.api.http.metrics import Metrics

pytestmark = pytest.mark.unit


def _count(m: Metrics, stream_type: str, outcome: str) -> float:
    value = m.registry.get_sample_value("tributary_commands_total", {"stream_type": stream_type, "outcome": outcome})
    return value or 0.0


def _observed(m: Metrics, stream_type: str) -> float:
    return m.registry.get_sample_value("tributary_command_seconds_count", {"stream_type": stream_type}) or 0.0


def _command(m: Metrics, stream_type: str, outcome: str) -> None:
    """What the command route does per command."""
    m.command_seconds.labels(stream_type).observe(0.002)
    m.commands.labels(stream_type, outcome).inc()


def test_commands_are_counted_by_type_and_outcome() -> None:
    m = Metrics()
    m.known_stream_types(["account"])
    for _ in range(3):
        _command(m, "account", "ok")
    _command(m, "account", "ConcurrencyConflict")
    _command(m, "typo", "UnknownStreamType")
    _command(m, "scan-1", "UnknownStreamType")
    assert _count(m, "account", "ok") == 3
    assert _count(m, "account", "ConcurrencyConflict") == 1
    assert _count(m, "other", "UnknownStreamType") == 2 and _count(m, "typo", "UnknownStreamType") == 0
    assert _observed(m, "account") == 4 and _observed(m, "other") == 2
    m.known_stream_types(["account", "typo"])  # a domain module defines it now
    _command(m, "typo", "ok")
    assert _count(m, "typo", "ok") == 1 and _observed(m, "typo") == 1 and _observed(m, "other") == 2


def test_series_past_the_kept_ones_still_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "_MAX_CHILDREN", 50)
    m = Metrics()
    m.known_stream_types([f"t{i}" for i in range(300)])
    for _ in range(2):
        for i in range(300):
            for outcome in ("ok", "CommandRejected"):
                _command(m, f"t{i}", outcome)
    assert all(_count(m, f"t{i}", o) == 2 for i in range(300) for o in ("ok", "CommandRejected"))
    assert all(_observed(m, f"t{i}") == 4 for i in range(300))


def test_labelled_series_are_looked_up_once_per_type_and_outcome() -> None:
    m = Metrics()
    m.known_stream_types(["account"])
    profile = cProfile.Profile()
    profile.enable()
    for i in range(200):
        _command(m, "account", "ok" if i % 2 else "CommandRejected")
    profile.disable()
    lookups = sum(
        calls
        for (path, _, name), (calls, *_) in pstats.Stats(profile).stats.items()  # type: ignore[attr-defined]
        if name == "labels" and "prometheus_client" in path
    )
    assert lookups <= 3, lookups  # one per (type, outcome) series: the histogram's and two counters'
    assert _count(m, "account", "ok") == 100 and _count(m, "account", "CommandRejected") == 100
