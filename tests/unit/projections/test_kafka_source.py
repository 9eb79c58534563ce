"""The pure parts of reading projections from Kafka: planning offset ranges, headers back as the
log's, and the run settings a rebuild child process gets."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.log.kafka.codec import kafka_headers, log_headers
from tributary.log.kafka.options import KafkaOptions
from tributary.projections.kafka_source import offset_ranges
from tributary.projections.runner import RunSettings, _settings_from_json, _settings_json

pytestmark = pytest.mark.unit

TPS = st.sampled_from([("a", 0), ("a", 1), ("b", 0)])


@given(
    hi=st.dictionaries(TPS, st.integers(0, 200)),
    lo=st.dictionaries(TPS, st.integers(0, 200)),
    split=st.integers(1, 50),
    topics=st.lists(st.sampled_from(["a", "b", "c"]), unique=True),
)
def test_ranges_cover_each_partitions_lo_to_hi_in_pieces_of_at_most_split(
    hi: dict[tuple[str, int], int], lo: dict[tuple[str, int], int], split: int, topics: list[str]
) -> None:
    ranges = offset_ranges(topics, lo, hi, split)
    assert all(0 < b - a <= split for _, _, a, b in ranges)
    for (topic, partition), end in hi.items():
        mine = sorted((a, b) for t, p, a, b in ranges if (t, p) == (topic, partition))
        start = lo.get((topic, partition), 0)
        if topic not in topics or start >= end:
            assert mine == []
            continue
        assert mine[0][0] == start and mine[-1][1] == end
        assert all(x[1] == y[0] for x, y in zip(mine, mine[1:], strict=False))  # contiguous, no overlap
    assert {(t, p) for t, p, _, _ in ranges} <= set(hi)


@given(st.dictionaries(st.text(min_size=1), st.text()))
def test_headers_come_back_as_the_log_wrote_them(headers: dict[str, str]) -> None:
    written = orjson.dumps(headers) if headers else None  # capture's headers: a JSON object of strings
    back = log_headers(kafka_headers(written))
    assert back == written


def test_headers_that_were_not_an_object_come_back_whole() -> None:
    assert log_headers(kafka_headers(b"[1,2]")) == b"[1,2]"


def test_a_rebuild_process_gets_the_kafka_options() -> None:
    s = RunSettings(
        dsn="postgresql://x",
        log_root=Path("/tmp/log"),
        modules=("m.py",),
        spark_conf={"spark.x": "1"},
        kafka=KafkaOptions(bootstrap_servers="k:9092", client={"security.protocol": "SSL"}, partitions=2),
    )
    assert _settings_from_json(json.loads(json.dumps(_settings_json(s)))) == s
    local = RunSettings(dsn="postgresql://x", log_root=Path("/tmp/log"))
    assert _settings_from_json(json.loads(json.dumps(_settings_json(local)))) == local
