"""Value mapping: one output for a streamed value and for the same datum as PostgreSQL text."""

from __future__ import annotations

import orjson
import pytest

from tributary.capture.decoding.values import (
    from_stream,
    from_text,
    parse_array,
    stream_converter,
    text_converter,
    type_family,
)

pytestmark = pytest.mark.unit

# (type, wal2json value, COPY text, expected JSON)
CASES = [
    ("integer", 5, "5", b"5"),
    ("bigint", 9007199254740993, "9007199254740993", b"9007199254740993"),
    (
        "numeric(40,10)",
        "12345678901234567890.1234567890",
        "12345678901234567890.1234567890",
        b'"12345678901234567890.1234567890"',
    ),
    ("numeric", 7, "7", b'"7"'),
    ("double precision", 0.1, "0.1", b"0.1"),
    ("real", float("nan"), "NaN", b"null"),
    ("boolean", True, "t", b"true"),
    ("boolean", False, "f", b"false"),
    ("jsonb", '{"a": [1, 2.50]}', '{"a": [1, 2.50]}', b'{"a": [1, 2.50]}'),
    ("timestamp with time zone", "2024-01-02 03:04:05.5+00", "2024-01-02 03:04:05.5+00", b'"2024-01-02T03:04:05.5Z"'),
    ("timestamp without time zone", "2024-01-02 03:04:05", "2024-01-02 03:04:05", b'"2024-01-02T03:04:05"'),
    ("timestamp with time zone", "infinity", "infinity", b'"infinity"'),
    ("bytea", "deadbeef", "\\xdeadbeef", b'"deadbeef"'),
    ("integer[]", "{1,NULL,3}", "{1,NULL,3}", b"[1,null,3]"),
    ("text[]", '{"a b","q\\"x",NULL,c}', '{"a b","q\\"x",NULL,c}', b'["a b","q\\"x",null,"c"]'),
    ("numeric[]", "{1.50,2}", "{1.50,2}", b'["1.50","2"]'),
    ("integer[]", "{{1,2},{3,4}}", "{{1,2},{3,4}}", b'"{{1,2},{3,4}}"'),
    (
        "uuid",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        b'"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"',
    ),
    ("interval", "1 day 02:03:04", "1 day 02:03:04", b'"1 day 02:03:04"'),
    ("text", None, None, b"null"),
]


@pytest.mark.parametrize(("type_name", "streamed", "text", "expected"), CASES)
def test_stream_and_text_agree(type_name: str, streamed: object, text: str | None, expected: bytes) -> None:
    assert orjson.dumps(from_stream(type_name, streamed)) == expected
    assert orjson.dumps(from_text(type_name, text)) == expected


def test_type_families() -> None:
    assert type_family("numeric(10,2)") == "numeric"
    assert type_family("character varying(20)") == "text"
    assert type_family("integer[]") == "array:int"
    assert type_family("timestamp(3) with time zone") == "tstz"
    assert type_family("timestamp(0) without time zone[]") == "array:ts"
    assert type_family("money") == "text"


def test_parse_array_edges() -> None:
    assert parse_array("{}") == []
    assert parse_array('{""}') == [""]
    assert parse_array('{"NULL",NULL}') == ["NULL", None]
    assert parse_array("not an array") is None


@pytest.mark.parametrize(("type_name", "streamed", "text", "expected"), CASES)
def test_cached_converters_agree_with_the_reference(
    type_name: str, streamed: object, text: str | None, expected: bytes
) -> None:
    stream_conv, text_conv = stream_converter(type_name), text_converter(type_name)
    assert orjson.dumps(streamed if stream_conv is None else stream_conv(streamed)) == expected
    assert orjson.dumps(text if text_conv is None or text is None else text_conv(text)) == expected
