"""codec_arrow.encode_columns writes the same lines as codec.encode_batch; its typed twin the
reference's (or declines); the snapshot's column partitions are Kafka's (log/local/partitioner.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tributary.capture.snapshot.columnar import murmur2_partitions
from tributary.log.local import codec_arrow
from tributary.log.local.codec import decode_line, encode_batch
from tributary.log.local.codec_arrow import _piece, encode_columns, encode_columns_python
from tributary.log.local.partitioner import partition_for

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


# --- the typed twin (log/local/_typed.pyx `encode_columns`) against `encode_columns_python` ---

_any_bits = st.binary(max_size=24)  # NUL, newline, anything: both sides splice bytes verbatim


@st.composite
def _column(draw: st.DrawFn, n: int) -> pa.Array:
    """A binary array of n values, maybe a slice of a longer one, maybe with an empty data buffer."""
    before = draw(st.lists(_any_bits, max_size=3))
    after = draw(st.lists(_any_bits, max_size=3))
    values = draw(st.lists(_any_bits, min_size=n, max_size=n))
    arr = pa.array(before + values + after, pa.binary())
    return arr.slice(len(before), n)


@st.composite
def _records(draw: st.DrawFn) -> tuple[pa.Array, list[pa.Array | pa.Scalar]]:
    n = draw(st.integers(0, 25))
    keys = draw(_column(n))
    args: list[pa.Array | pa.Scalar] = []
    for _ in range(draw(st.integers(0, 5))):
        if draw(st.booleans()):
            args.append(pa.scalar(draw(_any_bits), pa.binary()))
        else:
            args.append(draw(_column(n)))
    return keys, args


def test_the_typed_twin_is_built() -> None:
    """`pip install -e .` builds log/local/_typed.pyx in place: the tests run the typed path."""
    assert codec_arrow._typed_columns is not None


@settings(max_examples=400)
@given(
    first=st.one_of(st.integers(0, 2**40), st.integers(0, 2**63 - 1), st.integers(-(2**70), 2**70)),
    ts=st.one_of(st.integers(-(2**40), 2**41), st.sampled_from([-(2**63), 2**63 - 1, 0])),
    records=_records(),
)
def test_typed_encode_columns_is_the_reference_or_declines(
    first: int, ts: int, records: tuple[pa.Array, list[pa.Array | pa.Scalar]]
) -> None:
    """The same bytes and sizes as the pyarrow reference, or None; the dispatcher always gives the
    reference's answer (or its error)."""
    c = codec_arrow._typed_columns
    assert c is not None
    keys, args = records
    n = len(keys)
    pieces = [_piece(keys, n), *(_piece(a, n) for a in args)]
    assert None not in pieces
    got = c(first, ts, n, pieces)
    try:
        want = encode_columns_python(first, ts, keys, args)
    except (OverflowError, pa.ArrowException, ValueError):  # numbers past int64: the reference refuses
        assert got is None
        return
    if got is not None:
        assert got == want
    if -(2**63) <= ts < 2**63 and (0 <= first < 2**62 or (n == 0 and -(2**63) <= first < 2**63)):
        assert got is not None
    assert encode_columns(first, ts, keys, args) == want  # the dispatcher, whichever ran


def _buf(values: list[int]) -> pa.Buffer:
    return pa.py_buffer(np.array(values, np.int32))


def test_typed_encode_columns_declines_what_it_cannot_hold() -> None:
    c = codec_arrow._typed_columns
    assert c is not None
    off, abc = _buf([0, 1, 3]), pa.py_buffer(b"abc")
    ok = (off, abc, 0)
    assert c(0, 0, 2, [ok]) == encode_columns_python(0, 0, pa.array([b"a", b"bc"], pa.binary()), [])
    assert c(0, 0, 0, []) == (b"", [])  # no records: the reference's answer, whatever the pieces
    assert c(0, 0, 3, [ok]) is None  # offsets for 2 rows, 3 asked
    assert c(0, 0, 2, [(off, abc, 1)]) is None  # from the array's offset 1: one row left
    assert c(0, 0, 1, [(off, abc, 3)]) is None  # an offset past the buffer
    assert c(0, 0, 1, [(off, abc, -1)]) is None
    assert c(0, 0, 1, [(off, abc, 2**80)]) is None
    assert c(0, 0, 1, [(off, abc, "0")]) is None
    assert c(0, 0, 2, [(off, pa.py_buffer(b"ab"), 0)]) is None  # an offset past the data
    assert c(0, 0, 2, [(_buf([0, 3, 1]), abc, 0)]) is None  # backwards
    assert c(0, 0, 1, [(_buf([-1, 1]), abc, 0)]) is None  # negative
    assert c(0, 0, 2, [(_buf([0, 1]), abc, 0)]) is None  # a short offsets buffer
    assert c(0, 0, 2, [(pa.py_buffer(b"\x00\x00"), abc, 0)]) is None  # not even one offset
    assert c(0, 0, 2, [(off, 5, 0)]) is None  # not a buffer
    assert c(0, 0, 2, [(off, abc, 0, None)]) is None  # not a piece
    assert c(0, 0, 2, ["ab"]) is None
    assert c(0, 0, 2, []) is None  # no key
    assert c(0, 0, -1, [ok]) is None
    assert c(-1, 0, 2, [ok]) is None
    assert c(2**63 - 1, 0, 2, [ok]) is None  # the last offset past int64
    assert c(2**64, 0, 2, [ok]) is None
    assert c(0, 2**64, 2, [ok]) is None
    with pytest.raises(TypeError):
        c(0, 0, 2)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        c(0, 0, 2, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        c("0", 0, 2, [ok])  # type: ignore[arg-type]


def test_encode_columns_runs_the_reference_for_what_the_typed_twin_does_not_take(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = pa.array([b"1", b"2"], pa.binary())
    with_null = pa.array([b"a", None], pa.binary())
    big = pa.array([b"a", b"b"], pa.large_binary())
    for args in ([with_null], [big], [pa.scalar(None, pa.binary())], [pa.scalar("s", pa.string())]):
        assert _piece(args[0], 2) is None
    assert encode_columns(0, 0, keys, [with_null]) == encode_columns_python(0, 0, keys, [with_null])
    monkeypatch.setattr(codec_arrow, "_typed_columns", None)  # not built, or TRIBUTARY_IMPL=python
    args = [pa.array([b"x", b"yy"], pa.binary())]
    assert encode_columns(3, 4, keys, args) == encode_columns_python(3, 4, keys, args)
