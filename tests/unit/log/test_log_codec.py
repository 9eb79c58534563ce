"""Pure codecs: segment lines, index entries, the manifest; and the group-commit policy."""

from __future__ import annotations

import zlib

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.log.local import GroupCommitter, Record, TopicConfig, codec
from tributary.log.local.codec import BadLine, decode_line, encode_batch, encode_plain, encode_plain_python
from tributary.log.local.errors import LogError
from tributary.log.local.index import (
    lookup_offset,
    lookup_time,
    pack_offsets,
    pack_times,
    unpack_offsets,
    unpack_times,
)
from tributary.log.local.manifest import (
    Manifest,
    PartitionState,
    TopicState,
    decode_manifest,
    encode_manifest,
)

pytestmark = pytest.mark.unit


def _lines(data: bytes) -> list[bytes]:
    assert data.endswith(b"\n")
    return data[:-1].split(b"\n")


def test_round_trip_keeps_exact_bytes() -> None:
    recs = [
        (b'{"id":1}', b'{"n":1.10,"s":"a,\\"value\\":x"}', 1_700_000_000_000, b'{"h":1}'),
        (b'{"id":2}', None, 5, None),
        (None, b"[1,2]", -3, None),
    ]
    data, sizes, tss = encode_batch(40, recs)
    assert sizes == [len(x) + 1 for x in _lines(data)] and tss == (1_700_000_000_000, 5, -3)
    decoded = [decode_line(x) for x in _lines(data)]
    assert decoded == [
        (40, 1_700_000_000_000, b'{"id":1}', b'{"n":1.10,"s":"a,\\"value\\":x"}', b'{"h":1}'),
        (41, 5, b'{"id":2}', None, None),
        (42, -3, None, b"[1,2]", None),
    ]


def test_a_line_is_json_with_a_crc_of_what_precedes_it() -> None:
    data, _, _ = encode_batch(0, [(b'{"k":1}', b'{"v":2}', 7, None)])
    line = _lines(data)[0]
    doc = orjson.loads(line)
    assert doc["offset"] == 0 and doc["key"] == {"k": 1} and doc["value"] == {"v": 2}
    body = line[: line.index(b',"crc":')]
    assert doc["crc"] == zlib.crc32(body)


def test_pretty_printed_input_is_kept_on_one_line() -> None:
    data, sizes, _ = encode_batch(0, [(None, b'{\n  "a": 1\n}', 1, None), (None, b"2", 2, None)])
    assert data.count(b"\n") == 2 and len(sizes) == 2
    assert decode_line(_lines(data)[0])[3] == b'{"a":1}'


def test_flipped_byte_is_a_crc_mismatch_naming_the_offset() -> None:
    data, _, _ = encode_batch(9, [(b'{"id":1}', b'{"v":"hello"}', 1, None)])
    line = bytearray(_lines(data)[0])
    line[line.index(b"hello")] ^= 0x20
    with pytest.raises(BadLine, match="CRC mismatch") as exc:
        decode_line(bytes(line))
    assert exc.value.offset == 9


@pytest.mark.parametrize("cut", [5, 30, 60])
def test_truncated_line_is_refused(cut: int) -> None:
    data, _, _ = encode_batch(0, [(b'{"id":1}', b'{"v":"hello world"}', 1, None)])
    with pytest.raises(BadLine):
        decode_line(_lines(data)[0][:cut])


def test_record_to_json_embeds_fields_as_json() -> None:
    r = Record("t", 1, 2, 3, b'{"id":1}', b'{"x":[1]}', None)
    assert orjson.loads(r.to_json()) == {
        "topic": "t",
        "partition": 1,
        "offset": 2,
        "timestamp": 3,
        "key": {"id": 1},
        "value": {"x": [1]},
        "headers": None,
    }
    assert orjson.loads(Record("t", 0, 0, 0, None, None, None).to_json())["value"] is None


def test_offset_index_lookup() -> None:
    entries = [(10, 4096), (20, 8200), (35, 12300)]
    assert unpack_offsets(pack_offsets(entries)) == entries
    assert unpack_offsets(pack_offsets(entries) + b"\x00\x01") == entries  # torn tail ignored
    assert lookup_offset(entries, 0) == (0, 0)
    assert lookup_offset(entries, 9) == (0, 0)
    assert lookup_offset(entries, 10) == (10, 4096)
    assert lookup_offset(entries, 34) == (20, 8200)
    assert lookup_offset(entries, 1000) == (35, 12300)


def test_time_index_lookup() -> None:
    entries = [(100, 10), (250, 20), (250, 30), (900, 44)]
    assert unpack_times(pack_times(entries)) == entries
    assert lookup_time(entries, 50) == 0
    assert lookup_time(entries, 101) == 10
    assert lookup_time(entries, 250) == 10
    assert lookup_time(entries, 251) == 30
    assert lookup_time(entries, 10_000) == 44


def test_manifest_round_trip() -> None:
    m = Manifest(
        generation=7,
        topics={
            "shop.public.orders": TopicState(
                TopicConfig(partitions=2, policy="compact", delete_retention_ms=5),
                (PartitionState(0, 10, 8, 900), PartitionState(3, 4, 0, 120)),
            )
        },
        positions={"shop": "0/16B3748"},
    )
    assert decode_manifest(encode_manifest(m)) == m


@pytest.mark.parametrize("bad", [b"", b"{", b'{"format": 99}', b'{"format": 1, "generation": 1}', b"[]"])
def test_bad_manifest_is_a_clear_error(bad: bytes) -> None:
    with pytest.raises(LogError, match="manifest .* is unreadable"):
        decode_manifest(bad, "x/manifest.json")


def test_topic_config_validates() -> None:
    with pytest.raises(ValueError, match="partitions"):
        TopicConfig(partitions=0)
    with pytest.raises(ValueError, match="policy"):
        TopicConfig(partitions=1, policy="keep")  # type: ignore[arg-type]


def test_group_committer_linger_and_batch() -> None:
    gc = GroupCommitter(linger_ms=5, max_records=10)
    assert not gc.due(0) and gc.wait_ms(0) is None
    gc.record_appended(3, now_ms=100)
    assert not gc.due(104) and gc.wait_ms(102) == 3
    assert gc.due(105)
    gc.committed(105)
    gc.record_appended(10, now_ms=200)
    assert gc.due(200)
    gc.committed(200)
    assert not gc.due(10_000)


def test_nul_byte_in_a_field_takes_the_slow_path_intact() -> None:
    data, sizes, _ = encode_batch(3, [(b"1", b'"a\x00b"', 5, None), (None, b"2", 6, b"{}")])
    assert [decode_line(x) for x in _lines(data)] == [
        (3, 5, b"1", b'"a\x00b"', None),
        (4, 6, None, b"2", b"{}"),
    ]
    assert sum(sizes) == len(data)


_field = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(lambda i: orjson.dumps({"id": i})),
    st.text(max_size=20).map(orjson.dumps),
    st.sampled_from([b'{"a":\n1}', b'"nul\x00"', b"[]"]),  # a newline or a NUL: the general path
)


@given(
    first=st.integers(0, 2**40),
    ts=st.integers(-(2**40), 2**41),
    pairs=st.lists(st.tuples(_field, _field), max_size=30),
)
def test_encode_plain_equals_encode_batch(first: int, ts: int, pairs: list[tuple[bytes, bytes]]) -> None:
    keys = [k for k, _ in pairs]
    values = [v for _, v in pairs]
    data, sizes, _ = encode_batch(first, [(k, v, ts, None) for k, v in pairs])
    assert encode_plain(first, ts, keys, values) == (data, sizes)


_any_field = st.one_of(
    _field,
    st.binary(max_size=12),  # NUL, newline, anything: the general encoder's cases
    st.sampled_from([b"", b"\n", b"\x00", b'"\\n"', b"x" * 300]),
)


@given(
    first=st.one_of(st.integers(0, 2**40), st.integers(-(2**70), 2**70)),
    ts=st.one_of(st.integers(-(2**40), 2**41), st.integers(-(2**70), 2**70), st.sampled_from([-(2**63), 2**63 - 1])),
    pairs=st.lists(st.tuples(_any_field, _any_field), max_size=30),
)
def test_encode_plain_is_encode_batch_for_any_field(first: int, ts: int, pairs: list[tuple[bytes, bytes]]) -> None:
    """A NUL or a newline in a field, numbers past 64 bits: still `encode_batch`'s bytes, or its error."""
    keys = [k for k, _ in pairs]
    values = [v for _, v in pairs]
    try:
        data, sizes, _ = encode_batch(first, [(k, v, ts, None) for k, v in pairs])
    except ValueError:  # a newline in a field that is not JSON
        with pytest.raises(ValueError):
            encode_plain(first, ts, keys, values)
        return
    assert encode_plain(first, ts, keys, values) == (data, sizes)


def test_encode_plain_odd_arguments() -> None:
    assert encode_plain(0, 0, [], [b"x"]) == (b"", [])
    with pytest.raises(ValueError):
        encode_plain(0, 0, [b"1"], [])
    assert encode_plain(0, 0, (b"1",), (b"2",)) == encode_plain(0, 0, [b"1"], [b"2"])


def test_the_typed_twin_is_built() -> None:
    """`pip install -e .` builds log/local/_typed.pyx in place: the tests run the typed path."""
    assert codec._typed_plain is not None


@given(
    first=st.one_of(st.integers(0, 2**40), st.integers(-(2**70), 2**70)),
    ts=st.one_of(st.integers(-(2**40), 2**41), st.integers(-(2**70), 2**70), st.sampled_from([-(2**63), 2**63 - 1])),
    pairs=st.lists(st.tuples(_any_field, _any_field), max_size=30),
)
def test_typed_encode_plain_is_the_reference_or_declines(first: int, ts: int, pairs: list[tuple[bytes, bytes]]) -> None:
    """log/local/_typed.pyx `encode_plain` against `encode_plain_python`: the same bytes and
    sizes, or None (a NUL or a newline in a field, a number wider than 64 bits), never anything else."""
    typed = codec._typed_plain
    assert typed is not None
    keys = [k for k, _ in pairs]
    values = [v for _, v in pairs]
    got = typed(first, ts, keys, values)
    try:
        want = encode_plain_python(first, ts, keys, values)
    except ValueError:  # a newline in a field that is not JSON: the reference refuses, typed declines
        assert got is None
        return
    if got is not None:
        assert got == want
    clean = all(b"\x00" not in f and b"\n" not in f for f in keys + values)
    if clean and 0 <= first < 2**62 and -(2**63) <= ts < 2**63:
        assert got is not None
    assert encode_plain(first, ts, keys, values) == want  # the dispatcher, whichever ran


def test_typed_encode_plain_odd_arguments() -> None:
    typed = codec._typed_plain
    assert typed is not None
    assert typed(0, 0, [], [b"x"]) == (b"", []) == encode_plain_python(0, 0, [], [b"x"])
    assert typed(0, 0, [b"1"], []) is None  # the reference's zip(strict=True) raises: typed leaves it to it
    assert typed(0, 0, [b"1"], ["x"]) is None  # type: ignore[list-item]
    assert typed(0, 0, (b"1",), (b"2",)) == encode_plain_python(0, 0, [b"1"], [b"2"])
    with pytest.raises(TypeError):
        typed(0, 0, 5, [b"x"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        typed("0", 0, [b"1"], [b"2"])  # type: ignore[arg-type]
