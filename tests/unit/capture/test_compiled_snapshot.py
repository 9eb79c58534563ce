"""The columnar snapshot's COPY loop in C (capture/_speedups.c `take_copy`) against its reference
`snapshot.take_copy_python`. Pure: a scripted `get_copy_data` stands in for libpq. On a real COPY:
tests/integration/capture/test_snapshot_columnar.py::test_text_chunks_compiled_and_pure_are_equal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capture import compiled
from capture.snapshot import take_copy_python

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
