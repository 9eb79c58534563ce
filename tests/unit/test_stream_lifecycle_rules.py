"""The stream lifecycle's pure parts: metadata limits checked before the database, the delete
marker the outbox routes, the config key that runs the background scavenge, and what a projection
makes of a deleted stream."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tributary.api.settings.config import ConfigError, load_settings
from tributary.capture.records.outbox import STREAM_DELETED_PREFIX, route_stream_deleted
from tributary.eventstore.errors import InvalidValue
from tributary.eventstore.store import STREAM_DELETED_PREFIX as STORE_PREFIX
from tributary.eventstore.store import StreamMetadata, check_metadata
from tributary.projections.examples import account_balances
from tributary.projections.local import LocalView, run_local
from tributary.projections.records import decode

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("meta", "field"),
    [
        (StreamMetadata(max_age=0), "max_age"),
        (StreamMetadata(max_count=-1), "max_count"),
        (StreamMetadata(truncate_before=True), "truncate_before"),
        (StreamMetadata(max_count=2**62), "max_count"),
        (StreamMetadata(custom=[1]), "custom"),  # type: ignore[arg-type]
        (StreamMetadata(custom={"big": 2**70}), "custom.big"),  # beyond 64 bits
        (StreamMetadata(custom={"big": [4.1e114]}), "custom"),  # read back as an integer beyond 64 bits
        (StreamMetadata(custom={"nul": "a\x00b"}), "custom.nul"),
    ],
)
def test_metadata_limits_are_positive_integers(meta: StreamMetadata, field: str) -> None:
    with pytest.raises(InvalidValue) as refused:
        check_metadata(meta)
    assert refused.value.field == field


def test_metadata_within_limits_passes() -> None:
    check_metadata(StreamMetadata(max_age=1, max_count=1, truncate_before=1, custom={"a": [1]}))


def test_the_store_and_capture_agree_on_the_message_prefix() -> None:
    assert STORE_PREFIX == STREAM_DELETED_PREFIX


def test_a_delete_becomes_a_marker_then_a_tombstone() -> None:
    content = orjson.dumps(
        {"stream": "acc-1", "stream_type": "account", "hard": True, "version": 7, "occurred_at": "2026-01-02T03:04:05Z"}
    ).decode()
    marker, tombstone = route_stream_deleted(content)
    assert marker.topic == tombstone.topic == "events.account"
    assert marker.key == tombstone.key == b'"acc-1"'
    assert orjson.loads(marker.value or b"") == {
        "type": "$stream_deleted",
        "stream": "acc-1",
        "stream_type": "account",
        "hard": True,
        "version": 7,
        "occurred_at": "2026-01-02T03:04:05Z",
    }
    assert tombstone.value is None
    assert marker.timestamp_ms == tombstone.timestamp_ms == 1767323045000


def test_a_stream_never_stored_has_no_topic() -> None:
    assert route_stream_deleted('{"stream": "x", "stream_type": null, "hard": true, "version": 0}') == []


@pytest.mark.parametrize("value", ["-1", "604801", '"often"'])
def test_scavenge_interval_is_validated(tmp_path: Path, value: str) -> None:
    path = tmp_path / "t.toml"
    path.write_text(f"[eventstore]\nscavenge_interval_s = {value}\n")
    with pytest.raises(ConfigError, match="scavenge_interval_s"):
        load_settings(path)


def test_scavenge_interval_defaults_off(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text("[eventstore]\nscavenge_interval_s = 30\n")
    assert load_settings(path).eventstore.scavenge_interval_s == 30
    path.write_text("")
    assert load_settings(path).eventstore.scavenge_interval_s == 0


def _event(offset: int, kind: str, data: dict[str, str], version: int) -> bytes:
    return orjson.dumps({"type": kind, "data": data, "version": version, "occurred_at": f"2026-01-01T00:00:0{offset}Z"})


def test_a_projection_drops_a_deleted_account_and_keeps_a_recreated_one() -> None:
    topic = "events.account"
    raw = [
        (b'"a"', _event(0, "AccountOpened", {"owner": "ann"}, 1)),
        (b'"b"', _event(1, "AccountOpened", {"owner": "bob"}, 1)),
        (b'"a"', orjson.dumps({"type": "$stream_deleted", "stream": "a", "occurred_at": "2026-01-01T00:00:02Z"})),
        (b'"a"', None),
        (b'"b"', orjson.dumps({"type": "$stream_deleted", "stream": "b", "occurred_at": "2026-01-01T00:00:03Z"})),
        (b'"b"', None),
        (b'"b"', _event(4, "AccountOpened", {"owner": "bea"}, 2)),
    ]
    recs = [decode(topic, 0, i, 1767225600000 + i * 1000, k, v, None) for i, (k, v) in enumerate(raw)]
    view = LocalView()
    run_local(account_balances.PROJECTION, {(topic, 0): recs}, view)
    rows = [line.split("\t")[:2] for line in view.table()]
    assert rows == [["b", "bea"]]
