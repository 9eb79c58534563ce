"""wal2json documents recorded from a real server → typed messages → envelopes. Pure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tributary.capture.decoding.lsn import Lsn
from tributary.capture.decoding.values import UNAVAILABLE
from tributary.capture.decoding.wal2json import Begin, Change, Commit, LogicalMessage, Truncate, parse_message
from tributary.capture.records import envelope as env
from tributary.capture.records.schema_tracker import SCHEMA_KEY, SchemaTracker

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parents[2] / "fixtures" / "wal2json"
CTX: dict[str, Any] = {
    "source_name": "shop",
    "db": "db",
    "lsn": Lsn(1),
    "tx_id": 7,
    "commit_ts_ms": 1000,
    "now_ms": 2000,
}


def _messages(name: str) -> list[Any]:
    return [parse_message(line) for line in (FIXTURES / f"{name}.jsonl").read_bytes().splitlines()]


def _decoded(outputs: list[env.Output]) -> list[tuple[Any, Any]]:
    return [(orjson.loads(o.key) if o.key else None, orjson.loads(o.value) if o.value else None) for o in outputs]


def test_transactions_are_framed_with_their_end_lsn() -> None:
    msgs = _messages("types")
    begin, commit = msgs[0], msgs[2]
    assert isinstance(begin, Begin) and isinstance(commit, Commit)
    assert begin.nextlsn == commit.nextlsn > commit.lsn  # B already says where the transaction ends
    assert begin.xid == commit.xid and begin.timestamp_ms == commit.timestamp_ms > 1_700_000_000_000


def test_numeric_is_parsed_exactly_and_types_map() -> None:
    change = _messages("types")[1]
    assert isinstance(change, Change) and change.pk == ("id",)
    ((key, value),) = _decoded(env.envelopes_for(change, **CTX))
    assert key == {"id": 1}
    after = value["after"]
    assert after["n"] == "12345678901234567890.1234567890"
    assert after["j"] == {"k": [1, 2.5]} and after["by"] == "deadbeef"
    assert after["ia"] == [1, None] and after["ta"] == ["a b", "c"] and after["t"] == "tab\there"
    assert after["at"] == "2024-01-02T03:04:05.5Z" and after["nothing"] is None
    assert value["op"] == "c" and value["before"] is None
    assert value["source"] == {
        "connector": "tributary",
        "version": env.VERSION,
        "name": "shop",
        "db": "db",
        "schema": "public",
        "table": "fx_types",
        "lsn": int(change.lsn or 0),
        "txId": 7,
        "ts_ms": 1000,
        "snapshot": "false",
    }


def test_nan_numeric_arrives_as_null() -> None:
    change = _messages("types")[4]
    ((_, value),) = _decoded(env.envelopes_for(change, **CTX))
    assert value["after"]["n"] is None


def test_update_delete_and_primary_key_change() -> None:
    changes = [m for m in _messages("update_delete_pk_change") if isinstance(m, Change)]
    ins, upd, pk_change, delete = changes
    ((_, u),) = _decoded(env.envelopes_for(upd, **CTX))
    assert u["op"] == "u" and u["after"] == {"id": 1, "v": "b"} and u["before"] is None  # key-only identity
    d, tomb, c = _decoded(env.envelopes_for(pk_change, **CTX))
    assert d[1]["before"] == {"id": 1} and d[1]["after"] is None
    assert tomb == ({"id": 1}, None)
    assert c[1]["after"] == {"id": 2, "v": "b"}
    ops = [(k, v and v["op"]) for k, v in _decoded(env.envelopes_for(pk_change, **CTX))]
    assert ops == [({"id": 1}, "d"), ({"id": 1}, None), ({"id": 2}, "c")]
    assert [(k, v and v["op"]) for k, v in _decoded(env.envelopes_for(delete, **CTX))] == [
        ({"id": 2}, "d"),
        ({"id": 2}, None),
    ]


def test_unchanged_toast_is_marked_unavailable() -> None:
    ins, upd = [m for m in _messages("toast") if isinstance(m, Change)]
    known = [(c.name, c.type, c.typeoid) for c in ins.columns]
    assert [c.name for c in upd.columns] == ["id", "note"]  # wal2json omitted `big`
    ((_, value),) = _decoded(env.envelopes_for(upd, known_columns=known, **CTX))
    assert value["after"] == {"id": 1, "note": "b", "big": UNAVAILABLE}


def test_truncate_and_logical_message() -> None:
    msgs = _messages("truncate_message")
    trunc = next(m for m in msgs if isinstance(m, Truncate))
    ((key, value),) = _decoded(env.truncate_envelope(trunc, **CTX))
    assert key is None and value["op"] == "t" and value["source"]["table"] == "fx_tr"
    message = next(m for m in msgs if isinstance(m, LogicalMessage))
    (out,) = env.message_envelope(message, **CTX)
    assert out.topic == "shop.messages" and orjson.loads(out.key or b"") == "audit"
    assert orjson.loads(out.value or b"")["content"] == "hello"


def test_snapshot_row_matches_the_streamed_insert() -> None:
    change = _messages("types")[1]
    assert isinstance(change, Change)
    copy_text = [
        "1",
        "12345678901234567890.1234567890",
        "0.5",
        "t",
        "tab\there",
        '{"k": [1, 2.50]}',
        "\\xdeadbeef",
        "{1,NULL}",
        '{"a b",c}',
        "2024-01-02 03:04:05.5+00",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "1 day",
        None,
    ]
    (snap,) = env.snapshot_envelope(
        schema="public",
        table="fx_types",
        columns=change.column_types(),
        values=copy_text,
        primary_key=["id"],
        source_name="shop",
        db="db",
        lsn=Lsn(1),
        snapshot="last",
        now_ms=5,
    )
    (streamed,) = env.envelopes_for(change, **CTX)
    assert snap.key == streamed.key
    assert orjson.loads(snap.value or b"")["after"] == orjson.loads(streamed.value or b"")["after"]
    assert orjson.loads(snap.value or b"")["source"]["snapshot"] == "last"


def test_schema_tracker_announces_changes_not_toast_omissions() -> None:
    tracker = SchemaTracker()
    cols = [("id", "integer", 23), ("big", "text", 25)]
    first = tracker.observe("shop", "public", "t", cols, complete=True, key=["id"])
    assert first is not None and first.key == SCHEMA_KEY and first.topic == "shop.public.t"
    assert tracker.observe("shop", "public", "t", cols, complete=True, key=["id"]) is None
    assert tracker.observe("shop", "public", "t", cols[:1], complete=False, key=["id"]) is None  # TOAST omitted
    added = tracker.observe("shop", "public", "t", [*cols, ("n", "numeric", 1700)], complete=True, key=["id"])
    assert added is not None
    assert [c["name"] for c in orjson.loads(added.value)["schema"]["columns"]] == ["id", "big", "n"]
    # A partition's columns in another order are its root's columns: nothing to announce.
    shuffled = [("n", "numeric", 1700), ("id", "integer", 23), ("big", "text", 25)]
    assert tracker.observe("shop", "public", "t", shuffled, complete=True, key=["id"]) is None
    rekeyed = tracker.observe("shop", "public", "t", shuffled, complete=True, key=["big", "id"])
    assert rekeyed is not None and orjson.loads(rekeyed.value)["schema"]["key"] == ["big", "id"]


@pytest.mark.parametrize("marker", ["true", "last"])
def test_snapshot_encoder_prebuilt_tail_equals_the_generic_envelope(marker: str) -> None:
    """SnapshotEncoder serialises `source`/`op`/`ts_ms` once per table: the bytes must equal
    the generic one-dumps envelope for every row, awkward values included."""
    change = _messages("types")[1]
    assert isinstance(change, Change)
    columns = change.column_types()
    encoder = env.SnapshotEncoder(
        schema="public",
        table='fx "types"',
        columns=columns,
        primary_key=["id"],
        source_name="shöp",
        db="d\\b",
        lsn=Lsn(0x16B374D848),
        now_ms=1_790_000_000_123,
    )
    rows = [[str(i)] + [None] * (len(columns) - 1) for i in (0, -1, 2**62)] + [
        ["7", "1e-30", "NaN", "f", 'q"\\\n', "[]", "\\x", "{}", "{NULL}", "infinity", None, "-1 mons", None]
    ]
    for values in rows:
        out = encoder.encode(values, marker)
        source = env._source("shöp", "db", "public", 'fx "types"', Lsn(0x16B374D848), None, 1_790_000_000_123, marker)
        source["db"] = "d\\b"
        assert out.value == env._value(None, encoder.row(values), source, "r", 1_790_000_000_123)
        assert out.key == env._key(encoder.row(values), ["id"])


def test_change_lsn_fast_path_equals_lsn_parse() -> None:
    for text in ("0/0", "0/16B3748", "16/B374D848", "FFFFFFFF/FFFFFFFF"):
        assert env._lsn(text, None) == int(Lsn.parse(text))
    assert env._lsn(None, Lsn(5)) == Lsn(5)


_names = st.text(st.characters(codec="utf-8"), max_size=12)
_maybe_int = st.none() | st.integers(min_value=0, max_value=2**63 - 1)
_rows = st.none() | st.dictionaries(
    _names, st.none() | st.integers(-(2**62), 2**62) | _names | st.booleans(), max_size=4
)


@given(
    names=st.tuples(_names, _names, _names, _names),
    lsn=_maybe_int,
    tx_id=_maybe_int,
    ts_ms=_maybe_int,
    before=_rows,
    after=_rows,
    op=st.sampled_from("cud"),
    now_ms=st.integers(0, 2**62),
)
def test_streamed_value_bytes_equal_the_generic_envelope(
    names: tuple[str, str, str, str], lsn, tx_id, ts_ms, before, after, op: str, now_ms: int
) -> None:
    """A streamed change's `source` block is spliced from bytes serialised once per table: the
    result must be byte-identical to serialising the whole envelope dict (any names, nulls)."""
    source = env._source(*names, lsn, tx_id, ts_ms, "false")
    spliced = env._stream_value(before, after, env._source_json(*names, lsn, tx_id, ts_ms), op, now_ms)
    assert spliced == env._value(before, after, source, op, now_ms)
