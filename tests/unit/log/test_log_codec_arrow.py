"""codec_arrow.encode_columns writes the same lines as codec.encode_batch; the snapshot's column
partitions are Kafka's (capture/log/partitioner.py)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tributary.capture.log.codec import decode_line, encode_batch
from tributary.capture.log.codec_arrow import encode_columns
from tributary.capture.log.partitioner import partition_for
from tributary.capture.snapshot_columns import murmur2_partitions

pytestmark = pytest.mark.unit

_json_bits = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" ").replace(b"\x00", b" "))


@settings(max_examples=200)
@given(
    first=st.integers(0, 2**62),
    ts=st.integers(-(2**40), 2**41),
    rows=st.lists(st.tuples(_json_bits, _json_bits, _json_bits), min_size=0, max_size=30),
    head=_json_bits,
)
def test_encode_columns_equals_encode_batch(
    first: int, ts: int, rows: list[tuple[bytes, bytes, bytes]], head: bytes
) -> None:
    keys = pa.array([k for k, _, _ in rows], pa.binary())
    args = [
        pa.scalar(head, pa.binary()),
        pa.array([a for _, a, _ in rows], pa.binary()),
        pa.array([b for _, _, b in rows], pa.binary()),
    ]
    data, sizes = encode_columns(first, ts, keys, args)
    want, want_sizes, _ = encode_batch(first, [(k, head + a + b, ts, None) for k, a, b in rows])
    assert data == want
    assert sizes == want_sizes
    lines = data.split(b"\n")
    assert lines.pop() == b""
    for i, line in enumerate(lines):
        key, value = rows[i][0], head + rows[i][1] + rows[i][2]
        assert decode_line(line) == (
            first + i,
            ts,
            None if key == b"null" else key,
            None if value == b"null" else value,
            None,
        )


def test_encode_columns_on_sliced_arrays() -> None:
    keys = pa.array([b"1", b"22", b"333", b"4444"], pa.binary()).slice(1, 2)
    values = pa.array([b"a", b"bb", b"ccc", b"dddd"], pa.binary()).slice(2, 2)
    data, sizes = encode_columns(3, 9, keys, [values])
    want, want_sizes, _ = encode_batch(3, [(b"22", b"ccc", 9, None), (b"333", b"dddd", 9, None)])
    assert (data, sizes) == (want, want_sizes)


@settings(max_examples=300)
@given(keys=st.lists(st.binary(max_size=40), min_size=1, max_size=50), partitions=st.integers(1, 64))
def test_column_partitions_like_kafka(keys: list[bytes], partitions: int) -> None:
    got = murmur2_partitions(pa.array(keys, pa.binary()), partitions).tolist()
    assert got == [partition_for(k, partitions) for k in keys]


def test_column_partitions_on_a_sliced_array() -> None:
    keys = [b'{"id":%d}' % i for i in range(100)]
    arr = pa.array(keys, pa.binary()).slice(37, 40)
    assert murmur2_partitions(arr, 5).tolist() == [partition_for(k, 5) for k in keys[37:77]]
