"""The columnar snapshot's steps in C (capture/_speedups.c `take_copy`, `column_partitions`,
`risky_bytes`) against their references (`snapshot.take_copy_python`,
`snapshot_columns.murmur2_partitions_python`, `risky_bytes_python`). Pure: a scripted `get_copy_data` stands in for libpq. On a real COPY:
tests/integration/capture/test_snapshot_columnar.py::test_text_chunks_compiled_and_pure_are_equal.
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
from tributary.capture.log.partitioner import partition_for
from tributary.capture.snapshot import take_copy_python
from tributary.capture.snapshot_columns import (
    encode_chunk,
    murmur2_partitions,
    murmur2_partitions_python,
    plan,
    risky_bytes_python,
)

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
    assert take is not None  # built by `pip install -e .`: the tests run the compiled path
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


# --- the per-chunk scans: column_partitions and risky_bytes against their references ---

_key_bytes = st.binary(max_size=40)


@given(
    keys=st.lists(_key_bytes, max_size=60),
    before=st.lists(_key_bytes, max_size=3),
    after=st.lists(_key_bytes, max_size=3),
    partitions=st.one_of(st.integers(1, 64), st.sampled_from([1, 7, 2**31 - 1, 2**31, 2**32 - 1])),
)
def test_column_partitions_is_the_reference(
    keys: list[bytes], before: list[bytes], after: list[bytes], partitions: int
) -> None:
    """Kafka's partition of every key, as the numpy reference (and capture.log.partitioner) gives
    it, on sliced arrays too; the dispatcher always answers the reference's."""
    assert compiled.column_partitions is not None
    arr = pa.array(before + keys + after, pa.binary()).slice(len(before), len(keys))
    want = murmur2_partitions_python(arr, partitions)
    assert want.tolist() == [partition_for(k, partitions) for k in keys]
    out = np.full(len(keys), -5, np.int64)
    _validity, offsets, data = arr.buffers()
    got = compiled.column_partitions(offsets, b"" if data is None else data, arr.offset, out, partitions)
    if partitions <= 2**31 - 1:
        assert got is True
        assert out.tolist() == want.tolist()
    else:
        assert got is None
    assert murmur2_partitions(arr, partitions).tolist() == want.tolist()


def test_column_partitions_declines_what_it_cannot_hold() -> None:
    c = compiled.column_partitions
    assert c is not None
    off = np.array([0, 1, 3], np.int32)
    out = np.zeros(2, np.int64)
    assert c(off, b"abc", 0, out, 4) is True
    assert out.tolist() == [partition_for(b"a", 4), partition_for(b"bc", 4)]
    for odd in (
        (off, b"abc", 1, np.zeros(2, np.int64), 4),  # the offsets cover one key from 1
        (off, b"abc", 3, np.zeros(0, np.int64), 4),  # past the offsets
        (off, b"abc", -1, np.zeros(1, np.int64), 4),
        (off, b"ab", 0, np.zeros(2, np.int64), 4),  # an offset past the data
        (np.array([0, 3, 1], np.int32), b"abc", 0, np.zeros(2, np.int64), 4),  # backwards
        (np.array([-1, 1], np.int32), b"abc", 0, np.zeros(1, np.int64), 4),
        (off, b"abc", 0, np.zeros(2, np.int32), 4),  # not int64
        (off, b"abc", 0, np.zeros(2, np.float64), 4),
        (off, b"abc", 0, np.zeros(2, np.int64), 0),
        (off, b"abc", 0, np.zeros(2, np.int64), -3),
        (off, b"abc", 0, np.zeros(2, np.int64), 2**31),
    ):
        before = odd[3].copy()
        assert c(*odd) is None
        assert odd[3].tolist() == before.tolist()  # untouched on None
    with pytest.raises(BufferError):
        c(off, b"abc", 0, b"\x00" * 16, 4)  # `out` must be writable
    with pytest.raises(TypeError):
        c(off, b"abc", 0, np.zeros(2, np.int64))  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        c(off, "abc", 0, np.zeros(2, np.int64), 4)
    with pytest.raises(OverflowError):
        c(off, b"abc", 0, np.zeros(2, np.int64), 2**80)
    assert (
        murmur2_partitions(pa.array([b"a", None], pa.binary()), 3).tolist()
        == murmur2_partitions_python(pa.array([b"a", None], pa.binary()), 3).tolist()
    )  # a null key: the reference


_risky_alphabet = st.sampled_from(
    [b"\\", b"v", b"\\v", b"\x00", b"\x1f", b" ", b"\x7f", b"\x80", b"\xa0", b"\xff", b"a"]
)


@given(parts=st.lists(st.one_of(_risky_alphabet, st.binary(max_size=20)), max_size=40))
def test_risky_bytes_is_the_reference(parts: list[bytes]) -> None:
    assert compiled.risky_bytes is not None
    data = b"".join(parts)
    want = risky_bytes_python(data)
    assert want == (b"\\v" in data or any(b < 0x20 for b in data))
    for view in (data, memoryview(data), bytearray(data), pa.py_buffer(data)):
        assert compiled.risky_bytes(view) is want
    for cut in range(0, min(len(data), 9)):  # every alignment of the eight-byte words
        assert compiled.risky_bytes(data[cut:]) is risky_bytes_python(data[cut:])


def test_risky_bytes_odd_arguments() -> None:
    assert compiled.risky_bytes is not None
    assert compiled.risky_bytes(b"") is False is risky_bytes_python(b"")
    assert compiled.risky_bytes(b"x" * 15 + b"\\") is False  # a backslash at the very end
    assert compiled.risky_bytes(b"x" * 15 + b"\\v") is True
    assert compiled.risky_bytes(b"x" * 16 + b"\x1f") is True
    with pytest.raises(TypeError):
        compiled.risky_bytes("text")


@given(
    values=st.lists(
        st.tuples(
            st.integers(-(2**63), 2**63 - 1),
            st.lists(st.sampled_from(["a", "\\\\", "\\v", "\\n", "\x01", "\x1f", '"', "é", "\\\\v"]), max_size=6).map(
                "".join
            ),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_a_chunk_encodes_the_same_without_the_extension(values: list[tuple[int, str]]) -> None:
    """encode_chunk's keys, fragments and partitions with the compiled scans and without them."""
    p = plan([("id", "bigint"), ("t", "text")], ["id"])
    assert p is not None
    chunk = b"-\n" + b"".join(b"%d\t%s\n" % (i, t.encode()) for i, t in values)
    with_c = encode_chunk(p, chunk, 5)
    saved = compiled.column_partitions, compiled.risky_bytes
    try:
        compiled.column_partitions = compiled.risky_bytes = None
        without = encode_chunk(p, chunk, 5)
    finally:
        compiled.column_partitions, compiled.risky_bytes = saved
    assert with_c.keys.to_pylist() == without.keys.to_pylist()
    assert [f.to_pylist() for f in with_c.fragments] == [f.to_pylist() for f in without.fragments]
    assert with_c.partitions.tolist() == without.partitions.tolist()
