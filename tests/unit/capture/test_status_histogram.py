"""The commit-latency histogram the daemon carries to /metrics in its status file."""

from __future__ import annotations

import pytest

from tributary.capture.status import LatencyHistogram

pytestmark = pytest.mark.unit


def test_buckets_are_cumulative_with_inf_last() -> None:
    h = LatencyHistogram()
    for seconds in (0.0005, 0.001, 0.003, 0.2, 7.0):
        h.observe(seconds)
    out = h.to_json()
    buckets = dict((str(le), n) for le, n in out["buckets"])
    assert buckets["0.001"] == 2  # le is inclusive, as in Prometheus
    assert buckets["0.005"] == 3 and buckets["0.25"] == 4 and buckets["2.5"] == 4
    assert out["buckets"][-1] == ["+Inf", 5] and out["count"] == 5
    assert out["sum"] == pytest.approx(7.2045)
    counts = [n for _, n in out["buckets"]]
    assert counts == sorted(counts)


def test_empty_histogram_reports_zeroes() -> None:
    out = LatencyHistogram().to_json()
    assert out["count"] == 0 and out["sum"] == 0.0 and all(n == 0 for _, n in out["buckets"])
