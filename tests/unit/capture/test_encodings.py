"""capture/decoding/encodings.py: which databases' streams capture can decode, and which it refuses. Pure."""

from __future__ import annotations

import codecs

import pytest

from tributary.capture.decoding.encodings import CODECS, python_codec, refusal

pytestmark = pytest.mark.unit


def test_every_mapped_encoding_is_a_python_codec() -> None:
    for pg_name, codec in CODECS.items():
        assert codecs.lookup(codec), pg_name


def test_latin1_and_win1252_decode_to_the_same_text_as_the_server_stores() -> None:
    assert b"\xe9\xff".decode(python_codec("LATIN1") or "") == "éÿ"
    assert b"\xe9\x80".decode(python_codec("win1252") or "") == "é€"
    assert refusal("LATIN1", database="d") is None and refusal("UTF8", database="d") is None


def test_sql_ascii_and_undecodable_encodings_are_refused_in_one_line() -> None:
    sql_ascii = refusal("SQL_ASCII", database="legacy")
    assert sql_ascii is not None and "'legacy'" in sql_ascii and "unknown encoding" in sql_ascii
    assert "\n" not in sql_ascii
    assert python_codec("SQL_ASCII") is None
    mule = refusal("MULE_INTERNAL", database="d")
    assert mule is not None and "MULE_INTERNAL" in mule
