"""The typed receive loop for held INSERTs (capture/_hotpath.pyx `take_inserts`) against a Python
model of what `ReplicationConnection.read` + `SourceSession.handle` do with each message. Pure: a
scripted `get_copy_data` stands in for libpq. The same loop on a real replication stream is
tests/integration/capture/test_insert_templates.py::test_the_typed_receive_loop_holds_the_same_runs.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.capture import compiled

pytestmark = pytest.mark.unit

take = compiled.take_inserts
_HEADER = struct.Struct("!cQQQ")


def _xlog(payload: bytes) -> memoryview:
    return memoryview(_HEADER.pack(b"w", 1, 2, 3) + payload)


_INSERT = b'{"action":"I","xid":1,"lsn":"0/1"}'
_MESSAGES = st.one_of(
    st.builds(lambda tail: (1, _xlog(b'{"action":"I"' + tail)), st.binary(max_size=30)),  # an INSERT
    st.sampled_from(
        [
            (1, _xlog(b'{"action":"B","xid":1}')),
            (1, _xlog(b'{"action":"C","xid":1}')),
            (1, _xlog(b'{"action":"U"}')),
            (1, _xlog(b'{"action":"')),  # too short to be an INSERT
            (1, _xlog(b"")),
            (1, memoryview(b"w")),  # a header cut short: the usual path raises on it
            (1, memoryview(b"k" + bytes(17))),  # keepalive
            (1, memoryview(b"")),
            (1, b"w" + bytes(24) + _INSERT),  # bytes, not a memoryview: a buffer all the same
            (1, "not a buffer"),
            (0, b""),  # nothing buffered
            (-1, b""),  # the stream ended
            (-2, b""),
            (2**70, b""),
        ]
    ),
)


class _Script:
    """get_copy_data replaying a list; records each call's argument."""

    def __init__(self, messages: list[tuple[int, Any]]) -> None:
        self.messages = list(messages)
        self.calls: list[int] = []

    def __call__(self, async_: int) -> tuple[int, Any]:
        self.calls.append(async_)
        return self.messages.pop(0) if self.messages else (0, b"")


def _model(get: Callable[[int], tuple[int, Any]], run: list[bytes], room: int) -> tuple[int, Any] | None:
    """What `read` with `handle` does with each message while INSERTs are held (the reference)."""
    taken = 0
    while taken < room:
        got = get(1)
        n, data = got
        if n == 0:
            return None
        if n < 0 or not isinstance(data, bytes | memoryview):
            return got
        if len(data) < 37 or data[0] != 119 or data[36] != ord("I"):
            return got
        run.append(bytes(data[25:]))
        taken += 1
    return None


@given(messages=st.lists(_MESSAGES, max_size=30), room=st.integers(0, 12), held=st.lists(st.binary(), max_size=3))
def test_take_inserts_is_the_python_loop(messages: list[tuple[int, Any]], room: int, held: list[bytes]) -> None:
    assert take is not None  # built by `pip install -e .`: the tests run the typed path
    want_get, got_get = _Script(messages), _Script(messages)
    want_run, got_run = list(held), list(held)
    want = _model(want_get, want_run, room)
    got = take(got_get, got_run, room)
    assert got == want
    if got is not None:  # the very message it could not take, handed back untouched
        assert got is messages[len(got_get.calls) - 1]
    assert got_run == want_run
    assert got_get.calls == want_get.calls  # never reads past what it hands back


def test_take_inserts_passes_errors_on() -> None:
    assert take is not None

    def broken(_: int) -> tuple[int, Any]:
        raise OSError("connection lost")

    run: list[bytes] = []
    with pytest.raises(OSError, match="connection lost"):
        take(broken, run, 5)
    assert run == []
    script = _Script([(1, _xlog(_INSERT)), (1, _xlog(_INSERT))])
    assert take(script, run, 1) is None and run == [_INSERT]  # stops at `room`
    assert take(script, run, 5) is None and run == [_INSERT, _INSERT]  # then at "nothing buffered"
    with pytest.raises(TypeError):
        take(lambda _: None, run, 5)  # type: ignore[arg-type,return-value]  # as `n, data = get(1)` would
    with pytest.raises(TypeError):
        take(script, (), 5)  # type: ignore[arg-type]
