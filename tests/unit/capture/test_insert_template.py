"""INSERT templates (capture/streaming/insert_template.py) against the generic envelope path. Pure.

The law: for any value token a rule either declines (None) or gives exactly the bytes the generic
path gives; a template's (key, value) equals `envelope.envelopes_for`'s for the same document.
The end-to-end comparison on real wal2json output is tests/integration/capture/test_insert_templates.py.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.capture.decoding.values import stream_converter
from tributary.capture.decoding.wal2json import Change, parse_message
from tributary.capture.records import envelope as env
from tributary.capture.streaming import insert_template as it

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parents[2] / "fixtures" / "wal2json"
CTX: dict[str, Any] = {"source_name": "shop", "db": "db", "lsn": None, "tx_id": 7, "commit_ts_ms": 1000, "now_ms": 2000}


def _reference(type_name: str, tok: bytes) -> bytes:
    """What the generic path makes of one value token (numeric documents parse floats as text)."""
    numeric = type_name.startswith("numeric")
    value = json.loads(tok, parse_float=str) if numeric else orjson.loads(tok)
    conv = stream_converter(type_name)
    return orjson.dumps(value if conv is None else conv(value))


def _check(type_name: str, tok: bytes) -> bytes | None:
    rule = it._token_rule(type_name)
    got = tok if rule is None else rule(tok)
    if got is not None:
        assert got == _reference(type_name, tok), (type_name, tok)
    return got


def _template(doc: bytes, change: Change) -> it.InsertTemplate:
    template = it.InsertTemplate.build(change, doc, source_name="shop", db="db", key_columns=(), announced=0)
    assert template is not None
    return template


def _inserts() -> list[tuple[bytes, Change]]:
    out = []
    for path in sorted(FIXTURES.glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            msg = parse_message(line)
            if isinstance(msg, Change) and msg.action == "I":
                out.append((line, msg))
    return out


def test_recorded_inserts_give_the_generic_bytes() -> None:
    docs = _inserts()
    assert len(docs) >= 4
    encoded = 0
    for doc, change in docs:
        template = _template(doc, change)
        (want,) = env.envelopes_for(change, **CTX)
        got = template.encode(doc, doc.split(it.SPLIT), template.tx_part(7, 1000), 2000)
        if got is None:  # declined a value: allowed, never wrong
            continue
        encoded += 1
        assert (template.topic, *got) == (want.topic, want.key, want.value)
        many = template.encode_many([doc] * 3, template.tx_part(7, 1000), 2000)
        assert many == ([want.key] * 3, [want.value] * 3)
    assert encoded >= 3


def test_a_different_shape_is_declined() -> None:
    doc, change = next((d, c) for d, c in _inserts() if c.table == "fx_k")
    template = _template(doc, change)
    tx = template.tx_part(1, 2)
    retyped = doc.replace(b'"type":"text"', b'"type":"character varying"')
    added = doc.replace(b'}],"pk"', b'},{"name":"x","type":"text","typeoid":25,"value":"y"}],"pk"')
    no_lsn = doc.replace(b'"lsn":', b'"lsm":')
    for other in (retyped, added, no_lsn):
        assert other != doc
        assert template.encode(other, other.split(it.SPLIT), tx, 0) is None
        assert template.encode_many([doc, other], tx, 0) is None
    assert template.encode_many([doc], tx, 0) is not None


_text = st.text(st.characters(codec="utf-8"), max_size=12)
_escaped = st.lists(st.sampled_from(['\\"', "\\\\", "\\n", "\\t", "\\u0001", "\\u001f", "a", "é", "/"]), max_size=6)


@given(text=_text, raw=_escaped, type_name=st.sampled_from(["text", "uuid", "interval", "date", "bytea", "money"]))
def test_string_rules_are_exact_or_decline(text: str, raw: list[str], type_name: str) -> None:
    _check(type_name, orjson.dumps(text))
    _check(type_name, b'"' + "".join(raw).encode() + b'"')
    _check(type_name, b"null")
    assert _check(type_name, b"12") is None  # a bare token where a quoted one is expected


_zones = st.sampled_from(["+00", "+00:00", "+05:30", "-11", ""])


@given(
    stamp=st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31)),
    zone=_zones,
    bc=st.booleans(),
    special=st.sampled_from(["infinity", "-infinity", "12345-01-01 00:00:00+00", "2024-01-01 00:00:00+00 BC"]),
)
def test_timestamp_rules_are_exact_or_decline(stamp: dt.datetime, zone: str, bc: bool, special: str) -> None:
    text = stamp.isoformat(sep=" ") + zone + (" BC" if bc else "")
    for type_name in ("timestamp with time zone", "timestamp without time zone"):
        tok = orjson.dumps(text)
        got = _check(type_name, tok)
        if type_name.startswith("timestamp with") and zone == "+00" and not bc and stamp.year >= 1000:
            assert got is not None  # the usual UTC shape is never declined
        _check(type_name, orjson.dumps(special))
        rules = it._COLUMN_RULES[it._token_rule(type_name)]  # type: ignore[index]  # the column-wise form
        rule = it._token_rule(type_name)
        assert rule is not None
        for column in ([tok, tok], [tok, orjson.dumps(special), b"null", tok]):
            each = [rule(t) for t in column]
            assert rules(column) == (None if None in each else each)


@given(
    number=st.decimals(allow_nan=False, allow_infinity=False, places=12) | st.integers(-(10**40), 10**40).map(Decimal),
    extra=st.sampled_from(["-0", "0", "-0.0", "1.50", "12345678901234567890.123456789012345678901234567890", "null"]),
)
def test_numeric_rule_is_exact_or_declines(number: Decimal, extra: str) -> None:
    text = format(number, "f")
    _check("numeric", text.encode())
    _check("numeric(10,2)", extra.encode())


@given(value=st.one_of(st.integers(-(2**63), 2**63 - 1), st.booleans(), st.none()))
def test_ints_and_bools_pass_as_printed(value: object) -> None:
    tok = orjson.dumps(value)
    for type_name in ("bigint", "integer", "smallint", "oid", "boolean"):
        assert _check(type_name, tok) == tok


@given(value=st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**53), 2**53), st.none()))
def test_generic_rule_parses_one_token_as_the_document_would(value: object) -> None:
    for type_name in ("double precision", "real", "jsonb", "integer[]"):
        tok = orjson.dumps(value) if type_name != "jsonb" else orjson.dumps(orjson.dumps(value).decode())
        _check(type_name, tok)
