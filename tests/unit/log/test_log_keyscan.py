"""A topic's live keys (log/local/keys.py): the typed scan and the decoding reference agree
with a model fold over any records, commits and partitions; a damaged line is refused by the
typed scan and named by the reference."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tributary.log.local import CorruptRecordError, Log, TopicConfig, canonical_json, keyscan
from tributary.log.local.keys import SCHEMA_KEY
from tributary.log.local.keyscan import live_keys_in

pytestmark = pytest.mark.unit

TOPIC = "s.public.t"
record = st.tuples(st.integers(0, 30) | st.none(), st.booleans())  # key (None: keyless, 30: schema), tombstone?
batches = st.lists(st.lists(record, min_size=1, max_size=12), min_size=1, max_size=6)


def _key(k: int | None) -> bytes | None:
    if k is None:
        return None
    return SCHEMA_KEY if k == 30 else canonical_json({"id": k, "s": 'é\\"' * (k % 3)})


def _write(root: Path, spec: list[list[tuple[int | None, bool]]], partitions: int) -> set[bytes]:
    """Append the batches (one commit each, a tiny segment size so that splits span files) and
    return what a model fold says is live."""
    live: dict[bytes, bool] = {}
    with Log.open(root, writer=True, fsync=False, segment_bytes=600) as log:
        log.create_topic(TOPIC, TopicConfig(partitions=partitions, policy="compact"))
        for n, batch in enumerate(spec):
            for k, tomb in batch:
                key = _key(k)
                value = None if tomb else canonical_json({"n": n, "k": k})
                log.append(TOPIC, log.partition_for(TOPIC, key), [(key, value, n, None)])
                if key is not None and key != SCHEMA_KEY:
                    live[key] = not tomb
            log.commit()
        log.append(TOPIC, 0, [(_key(1), b'{"uncommitted":1}', 99, None)])  # never committed: not seen
    return {k for k, alive in live.items() if alive}


def _live(log: Log) -> set[bytes]:
    return live_keys_in(log.splits(TOPIC, max_bytes=1 << 20), log.end_offsets(TOPIC))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=batches, partitions=st.integers(1, 3))
def test_live_keys_equal_a_model_fold_typed_and_reference(
    spec: list[list[tuple[int | None, bool]]], partitions: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        want = _write(Path(tmp) / "log", spec, partitions)
        with Log.open(Path(tmp) / "log") as log:
            typed = _live(log)
            with monkeypatch.context() as m:
                m.setattr(keyscan, "_key_spans", None)  # not built, or TRIBUTARY_PURE_PYTHON=1
                reference = _live(log)
    assert typed == want
    assert reference == want


def test_latest_live_keeps_a_key_whose_last_record_is_not_a_tombstone() -> None:
    keys = pa.array([b"a", b"b", b"a", b"c", b"b", b"c"], pa.binary())
    tomb = np.array([False, False, True, False, True, False])
    assert sorted(keyscan.latest_live(keys, tomb).to_pylist()) == [b"c"]
    assert keyscan.latest_live(pa.array([], pa.binary()), np.array([], bool)).to_pylist() == []


def test_a_damaged_line_is_refused_by_the_typed_scan_and_named_by_the_reference(tmp_path: Path) -> None:
    pytest.importorskip("tributary.log.local._typed")
    with Log.open(tmp_path / "log", writer=True, fsync=False) as log:
        log.create_topic(TOPIC, TopicConfig(partitions=1, policy="compact"))
        log.append(TOPIC, 0, [(_key(k), canonical_json({"v": k}), 0, None) for k in range(5)])
        log.commit()
    segment = next((tmp_path / "log").rglob("*.log"))
    data = bytearray(segment.read_bytes())
    spans = [np.empty(10, np.int64) for _ in range(3)]
    tomb = np.empty(10, np.uint8)
    from tributary.log.local import _typed

    assert _typed.key_spans(bytes(data), *spans, tomb) == 5
    at = data.index(b'"v":3')
    data[at + 4] = ord("4")  # same length, wrong CRC
    segment.write_bytes(bytes(data))
    assert _typed.key_spans(bytes(data), *spans, tomb) == -1
    with Log.open(tmp_path / "log") as log, pytest.raises(CorruptRecordError):
        _live(log)
