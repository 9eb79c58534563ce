"""The columnar snapshot's per-row and per-chunk steps: the typed COPY loop (capture/_hotpath.pyx
`take_copy`) against its reference (`snapshot.reader.take_copy_python`), the column partitions against
Kafka's, the control-byte scan against its definition. Pure: a scripted `get_copy_data` stands in
for libpq. On a real COPY: tests/integration/capture/test_snapshot_columnar.py::test_text_chunks_typed_and_pure_are_equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.capture import compiled
from tributary.capture.snapshot.columnar import _has_risky_bytes, murmur2_partitions
from tributary.capture.snapshot.reader import take_copy_python
from tributary.log.local.partitioner import partition_for

pytestmark = pytest.mark.unit

take = compiled.take_copy

_ROWS = st.lists(
    st.one_of(
        st.binary(min_size=1, max_size=40).map(lambda b: (len(b), b)),
        st.binary(min_size=1, max_size=40).map(lambda b: (len(b), memoryview(b))),
        st.binary(min_size=1, max_size=40).map(lambda b: (len(b), bytearray(b))),
        st.binary(max_size=5).map(lambda b: (7, b)),  # n and the data disagree: the data counts
        st.just((2**70, b"big")),  # a positive n past 64 bits: still a row
    ),
    max_size=30,
)
_ENDS = st.sampled_from([0, -1, -2, -(2**70)])


def _script(messages: list[tuple[int, Any]]) -> tuple[Callable[[int], tuple[int, Any]], list[int]]:
    it = iter(messages)
    calls: list[int] = []

    def get(block: int) -> tuple[int, Any]:
        calls.append(block)
        return next(it)

    return get, calls


@given(rows=_ROWS, end=_ENDS, head=st.binary(max_size=4), limit=st.integers(-5, 400))
def test_take_copy_is_the_reference(rows: list[tuple[int, Any]], end: int, head: bytes, limit: int) -> None:
    """The same bytes appended, the same answer, the same messages taken (no more, no fewer)."""
    assert take is not None  # built by `pip install -e .`: the tests run the typed path
    messages = [*rows, (end, b"")]
    got_buf, want_buf = bytearray(head), bytearray(head)
    get_c, calls_c = _script(messages)
    get_p, calls_p = _script(messages)
    got = take(get_c, got_buf, limit)
    want = take_copy_python(get_p, want_buf, limit)
    assert (got, got_buf, calls_c) == (want, want_buf, calls_p)
    assert type(got) is int


def test_take_copy_odd_answers_raise_like_the_reference() -> None:
    assert take is not None
    for odd in ([None], [(1,)], [(None, b"x")], [(1, 5)], [(1, "text")]):
        for fn in (take, take_copy_python):
            get, _ = _script(odd)  # type: ignore[arg-type]
            with pytest.raises((TypeError, ValueError)):  # not (n, data): both refuse
                fn(get, bytearray(), 10)

    def boom(block: int) -> tuple[int, Any]:
        raise OSError("gone")

    with pytest.raises(OSError, match="gone"):
        take(boom, bytearray(), 10)
    with pytest.raises(TypeError):
        take(boom, b"", 10)  # type: ignore[arg-type]  # a bytearray only
    with pytest.raises(TypeError):
        take(boom, bytearray())  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        take(boom, bytearray(), "10")  # type: ignore[arg-type]
    get, calls = _script([])
    assert take(get, bytearray(b"abc"), 3) == 1 and calls == []  # already full: no call


# --- the per-chunk scans: Kafka's partitions and the control-byte check ---

_key_bytes = st.binary(max_size=40)


@given(
    keys=st.lists(_key_bytes, max_size=60),
    before=st.lists(_key_bytes, max_size=3),
    after=st.lists(_key_bytes, max_size=3),
    partitions=st.one_of(st.integers(1, 64), st.sampled_from([1, 7, 2**31 - 1, 2**31, 2**32 - 1])),
)
def test_column_partitions_are_kafkas(
    keys: list[bytes], before: list[bytes], after: list[bytes], partitions: int
) -> None:
    """Kafka's partition of every key (tributary.log.local.partitioner), on sliced arrays too."""
    arr = pa.array(before + keys + after, pa.binary()).slice(len(before), len(keys))
    got = murmur2_partitions(arr, partitions)
    assert got.dtype == np.int64
    assert got.tolist() == [partition_for(k, partitions) for k in keys]


_risky_alphabet = st.sampled_from(
    [b"\\", b"v", b"\\v", b"\x00", b"\x1f", b" ", b"\x7f", b"\x80", b"\xa0", b"\xff", b"a"]
)


@given(
    parts=st.lists(st.one_of(_risky_alphabet, st.binary(max_size=20)), max_size=40),
    before=st.lists(st.binary(max_size=5), max_size=2),
)
def test_risky_bytes_finds_control_bytes_and_v(parts: list[bytes], before: list[bytes]) -> None:
    """A column holds a byte below 0x20 or COPY's `\\v` (in any of its values, sliced or not)."""
    values = [b"".join(parts[i::3]) for i in range(3)]
    col = pa.array(before + values, pa.binary()).slice(len(before))
    data = b"".join(values)
    assert _has_risky_bytes(col) == (b"\\v" in data or any(b < 0x20 for b in data))
