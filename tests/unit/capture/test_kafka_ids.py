"""Which producer a position belongs to on the Kafka backend: one transactional producer per
source, `<[log.kafka] transactional_id>-<source>`, and a source's own entries (`<source>#…`)
committed by that source's producer."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.capture.snapshot.chunked import context_key
from tributary.log.kafka.options import KafkaOptions
from tributary.log.kafka.writer import position_owner, transactional_id

pytestmark = pytest.mark.unit

names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,30}", fullmatch=True)


@given(names)
def test_a_source_and_its_snapshot_context_share_a_producer(name: str) -> None:
    assert position_owner(name) == name
    assert position_owner(context_key(name)) == name


@given(names, names)
def test_each_source_has_its_own_transactional_id_under_the_prefix(a: str, b: str) -> None:
    options = KafkaOptions(bootstrap_servers="b:9092", transactional_id="tributary-capture")
    assert transactional_id(options, a) == f"tributary-capture-{a}"
    assert (transactional_id(options, a) == transactional_id(options, b)) == (a == b)
