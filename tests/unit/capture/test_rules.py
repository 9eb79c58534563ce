"""Column and row rules (capture/records/rules.py, row_filter.py) and their envelopes. Pure."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
import pytest

from tests.unit.capture.test_capture_envelopes import CTX
from tributary.api.settings.config import RuleSettings, SourceSettings
from tributary.api.settings.masking import masked
from tributary.capture.decoding.lsn import Lsn
from tributary.capture.decoding.values import UNAVAILABLE
from tributary.capture.decoding.wal2json import Change, parse_message
from tributary.capture.errors import SourceMisconfigured
from tributary.capture.records import envelope as env
from tributary.capture.records.row_filter import compile_filter
from tributary.capture.records.rules import RuleSpec, SourceRules, TableRules

pytestmark = pytest.mark.unit

SPEC = RuleSpec(
    tables=("public.cust*",),
    exclude=("ssn",),
    mask=("card",),
    mask_chars=4,
    hash=("email",),
    hash_salt="s",
    truncate=("bio",),
    truncate_chars=3,
    row_filter="status = 'open'",
)


@pytest.mark.parametrize(
    ("text", "row", "kept"),
    [
        ("a = 1", {"a": 1}, True),
        ("a = 1", {"a": None}, False),
        ("not a = 1", {"a": None}, False),  # unknown stays unknown, as in SQL
        ("a is null or a > 3", {"a": None}, True),
        ("a is not null and a <> 'x'", {"a": "y"}, True),
        ("n >= 10.5", {"n": "10.50"}, True),  # a numeric column's text against a number
        ("n < 10", {"n": "not a number"}, False),
        ("r in ('eu', 'uk') and not (s = 'closed')", {"r": "uk", "s": "open"}, True),
        ("r not in ('eu', 'uk')", {"r": "us"}, True),
        ("\"Odd Name\" = 'it''s'", {"Odd Name": "it's"}, True),
        ("flag = true OR flag IS NULL", {"flag": False}, False),
        ("a = 'text'", {"a": 5}, False),  # a number against text: never equal
    ],
)
def test_row_filters_follow_sql_three_valued_logic(text: str, row: dict[str, Any], kept: bool) -> None:
    assert compile_filter(text).keeps(row) is kept


@pytest.mark.parametrize("text", ["", "a =", "a = 1 and", "(a = 1", "a == 1", "a in ()", "1 = a", "a = b"])
def test_a_malformed_filter_is_one_line(text: str) -> None:
    with pytest.raises(ValueError, match="row filter") as err:
        compile_filter(text)
    assert "\n" not in str(err.value)


def test_columns_are_excluded_masked_hashed_and_truncated() -> None:
    rules = TableRules(SPEC, ("id",))
    row = {"id": 1, "ssn": "123", "card": 4111, "email": "a@b", "bio": "long text", "status": "open", "n": None}
    out = rules.apply(row)
    assert out == {
        "id": 1,
        "card": "****",
        "email": hashlib.sha256(b"sa@b").hexdigest(),
        "bio": "lon",
        "status": "open",
        "n": None,
    }
    assert row["ssn"] == "123", "the row read is left as it was"
    assert rules.apply({"id": 1, "card": None, "email": UNAVAILABLE}) == {"id": 1, "card": None, "email": UNAVAILABLE}
    assert TableRules(SPEC, ("id",)).apply(row) == out, "a hash is stable"


def test_key_columns_cannot_be_excluded_or_truncated() -> None:
    rules = SourceRules("shop", [SPEC])
    assert rules.for_table("public", "orders", ("id",)) is None
    with pytest.raises(SourceMisconfigured, match="exclude names key column 'ssn' of public.customers"):
        rules.for_table("public", "customers", ("ssn",))
    with pytest.raises(SourceMisconfigured, match="truncate names key column 'bio'"):
        rules.for_table("public", "customers", ("id", "bio"))
    assert rules.for_table("public", "customers", ("email",)) is not None  # hashed in the key too


def _doc(action: str, columns: dict[str, Any], identity: dict[str, Any] | None = None, pk: str = "id") -> Change:
    def cols(row: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"name": k, "type": "integer" if k == "id" else "text", "value": v} for k, v in row.items()]

    doc: dict[str, Any] = {"action": action, "schema": "public", "table": "customers", "pk": [{"name": pk}]}
    if action != "D":
        doc["columns"] = cols(columns)
    if identity is not None:
        doc["identity"] = cols(identity)
    change = parse_message(orjson.dumps(doc))
    assert isinstance(change, Change)
    return change


def _ops(change: Change, key: tuple[str, ...] = ("id",)) -> list[tuple[Any, str | None, Any]]:
    rules = TableRules(SPEC, key)
    out = env.envelopes_for(change, rules=rules, key_columns=key, **CTX)
    decoded = [(orjson.loads(o.key or b"null"), orjson.loads(o.value) if o.value else None) for o in out]
    return [(k, v and v["op"], v and (v["after"] or v["before"])) for k, v in decoded]


OPEN = {"id": 1, "ssn": "9", "card": "c", "email": "e", "status": "open"}
SHUT = OPEN | {"status": "closed"}


def test_row_filter_moves_in_the_stream() -> None:
    assert _ops(_doc("I", SHUT)) == []
    ((key, op, after),) = _ops(_doc("I", OPEN))
    assert key == {"id": 1} and op == "c" and "ssn" not in after and after["card"] == "****"
    assert [op for _, op, _ in _ops(_doc("U", SHUT, OPEN))] == ["d", None], "out of the filter: delete + tombstone"
    assert [op for _, op, _ in _ops(_doc("U", OPEN, SHUT))] == ["c"], "into the filter: a create"
    assert [op for _, op, _ in _ops(_doc("U", OPEN, OPEN))] == ["u"]
    assert _ops(_doc("U", SHUT, SHUT)) == []
    assert _ops(_doc("D", {}, SHUT)) == []
    assert [op for _, op, _ in _ops(_doc("D", {}, OPEN))] == ["d", None]
    # Only the key as the old row (no REPLICA IDENTITY FULL): out is a delete, in an update.
    assert [op for _, op, _ in _ops(_doc("U", SHUT, {"id": 1}))] == ["d", None]
    assert [op for _, op, _ in _ops(_doc("U", OPEN, {"id": 1}))] == ["u"]
    assert [op for _, op, _ in _ops(_doc("D", {}, {"id": 1}))] == ["d", None]


def test_a_hashed_key_is_hashed_in_the_key_of_every_record() -> None:
    key = ("email",)
    hashed = {"email": hashlib.sha256(b"se").hexdigest()}
    moved = _ops(_doc("U", OPEN | {"email": "f"}, OPEN, pk="email"), key)
    assert [(k, op) for k, op, _ in moved] == [
        (hashed, "d"),
        (hashed, None),
        ({"email": hashlib.sha256(b"sf").hexdigest()}, "c"),
    ]
    encoder = env.SnapshotEncoder(
        schema="public",
        table="customers",
        columns=[("email", "text", 25), ("status", "text", 25), ("ssn", "text", 25)],
        primary_key=key,
        source_name="shop",
        db="db",
        lsn=Lsn(1),
        now_ms=1,
        rules=TableRules(SPEC, key),
    )
    out = encoder.encode_ruled(["e", "open", "123"])
    assert out is not None and orjson.loads(out.key) == hashed and b"123" not in out.value  # type: ignore[operator]
    assert encoder.encode_ruled(["e", "closed", "123"]) is None


def test_settings_refuse_inconsistent_rules_in_one_line() -> None:
    with pytest.raises(ValueError, match="hash_salt is required"):
        RuleSettings(tables=("public.t",), hash=("a",))
    with pytest.raises(ValueError, match="column 'a' is in both mask and hash"):
        RuleSettings(tables=("public.t",), mask=("a",), hash=("a",), hash_salt="s")
    source = SourceSettings(
        name="shop", dsn="postgresql://u@h/db", rules=(RuleSettings(tables=("public.t",), hash=("a",), hash_salt="s"),)
    )
    shown = masked(source)
    assert shown["rules"][0]["hash_salt"] == "***"  # type: ignore[index,call-overload]


def test_a_document_error_never_quotes_column_values() -> None:
    doc = b'{"action":"X","schema":"public","table":"t","columns":[{"name":"ssn","type":"text","value":"123-45"}]}'
    with pytest.raises(ValueError, match="unknown wal2json action 'X'") as err:
        parse_message(doc)
    assert b"123-45".decode() not in str(err.value) and '"table":"t"' in str(err.value)
