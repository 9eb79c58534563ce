"""The columnar snapshot's pure pieces: which tables it takes, and each column's JSON fragment
against the reference (COPY unescape → capture.values → orjson) on hand-written COPY text."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tributary.capture.decoding.values import text_converter
from tributary.capture.snapshot import columnar as sc

pytestmark = pytest.mark.unit


def _copy_text(value: str | None) -> bytes:
    """PostgreSQL's COPY text spelling of a value (CopyAttributeOutText)."""
    if value is None:
        return b"\\N"
    out = []
    for ch in value:
        special = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f", "\v": "\\v"}
        out.append(special.get(ch, ch))
    return "".join(out).encode()


def _fragments(type_name: str, texts: list[bytes]) -> list[bytes]:
    p = sc.plan([("id", "bigint"), ("v", type_name)], ["id"])
    assert p is not None
    chunk = b"-\n" + b"".join(b"%d\t%b\n" % (i, t) for i, t in enumerate(texts))
    recs = sc.encode_chunk(p, chunk, 4)
    return recs.fragments[1].to_pylist()


def test_plan_declines_json_floats_arrays_and_keyless_tables() -> None:
    for type_name in ("jsonb", "json", "double precision", "real", "integer[]", "text[]"):
        assert sc.plan([("id", "integer"), ("x", type_name)], ["id"]) is None
    assert sc.plan([("id", "integer")], []) is None
    assert sc.plan([("id", "integer")], ["nope"]) is None
    p = sc.plan([("z", "integer"), ("a b", "text"), ("id", "uuid")], ["z", "id"])
    assert p is not None
    assert p.key_index == (2, 0)  # canonical key order: sorted names
    assert p.key_heads == (b'{"id":', b',"z":')
    assert p.after_heads[0] == b'{"before":null,"after":{"z":'


@settings(max_examples=300)
@given(
    values=st.lists(
        st.one_of(
            st.none(),
            st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=10),
            st.sampled_from(["\\v", '"', "\\", "\v\\v", "\x01", "\ufeff", "\\N", ""]),
        ),
        min_size=1,
        max_size=20,
    )
)
def test_text_fragments_equal_the_reference(values: list[str | None]) -> None:
    got = _fragments("text", [_copy_text(v) for v in values])
    assert got == [orjson.dumps(v) for v in values]


@pytest.mark.parametrize(
    ("type_name", "text"),
    [
        ("timestamp with time zone", "2024-01-02 03:04:05.5+00"),
        ("timestamp with time zone", "2024-01-02 03:04:05+05:30"),
        ("timestamp with time zone", "2024-01-02 03:04:05+00:00"),
        ("timestamp with time zone", "0044-03-15 12:00:00+00 BC"),
        ("timestamp with time zone", "infinity"),
        ("timestamp with time zone", "-infinity"),
        ("timestamp without time zone", "1999-12-31 23:59:59.999999"),
        ("timestamp without time zone", "0001-01-01 00:00:00 BC"),
        ("timestamptz", "Tue Jan 02 03:04:05.5 2024 UTC"),  # DateStyle Postgres: only the first space
        ("bytea", "\\x00ff5c09"),
        ("bytea", "\\x"),
        ("bytea", "abc\\000"),  # bytea_output = escape: the reference
        ("numeric", "12345678901234567890.123456789012345678901234567890"),
        ("numeric", "NaN"),
        ("boolean", "t"),
        ("boolean", "f"),
        ("integer", "-2147483648"),
        ("bigint", "9223372036854775807"),
        ("uuid", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        ("interval", "1 year 2 mons -3 days 04:05:06.7"),
        ("character varying(5)", 'a"\x1fb'),
    ],
)
def test_typed_fragments_equal_the_reference(type_name: str, text: str) -> None:
    conv = text_converter(type_name)
    (got,) = _fragments(type_name, [_copy_text(text)])
    assert got == orjson.dumps(text if conv is None else conv(text))
    assert got == sc.reference_fragment(conv, _copy_text(text))


def test_null_in_every_family() -> None:
    for type_name in ("integer", "boolean", "text", "numeric", "timestamptz", "timestamp", "bytea", "date"):
        assert _fragments(type_name, [b"\\N"]) == [b"null"]


def test_keys_and_partitions_of_a_chunk() -> None:
    p = sc.plan([("b", "text"), ("a", "integer")], ["b", "a"])
    assert p is not None
    recs = sc.encode_chunk(p, b'-\nx"y\t5\n\\N\t\\N\n', 3)
    assert recs.keys.to_pylist() == [b'{"a":5,"b":"x\\"y"}', b'{"a":null,"b":null}']
    assert recs.rows == 2
