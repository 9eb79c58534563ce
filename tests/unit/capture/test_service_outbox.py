"""A service's outbox row → its event (capture/records/service_outbox.py), and the `[[sources.outbox]]`
settings that configure it."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tributary.api.settings.config import ConfigError, load_settings
from tributary.api.settings.sources import source_specs
from tributary.capture.records.service_outbox import OutboxRowError, OutboxTable

pytestmark = pytest.mark.unit

ROW = {
    "id": "7c2f",
    "aggregatetype": "Order Line",
    "aggregateid": "42",
    "type": "Added",
    "payload": orjson.Fragment(b'{"sku": "x"}'),
    "tenant": 3,
}


def test_a_row_is_one_event_named_by_its_aggregate_type() -> None:
    (out,) = OutboxTable("public.outbox", header_columns=("tenant",)).route(ROW)
    assert out.topic.startswith("outbox.event.Order_Line_")  # a valid topic name (routing.topic_part)
    assert out.key == b'"42"'
    assert out.value == b'{"sku": "x"}'  # jsonb as it is
    assert orjson.loads(out.headers or b"") == {"id": "7c2f", "type": "Added", "tenant": "3"}
    assert out.timestamp_ms is None  # the transaction's commit time


def test_configured_columns_and_topic() -> None:
    table = OutboxTable(
        "s.events", id_column="eid", key_column="agg", type_column="kind", payload_column="body",
        route_by_column="stream", topic="svc.{route}.v1",
    )  # fmt: skip
    (out,) = table.route({"eid": 1, "agg": None, "kind": "K", "body": "text", "stream": "orders"})
    assert (out.topic, out.key, out.value) == ("svc.orders.v1", None, b'"text"')
    assert orjson.loads(out.headers or b"") == {"id": "1", "type": "K"}


def test_a_row_that_cannot_be_an_event_is_one_line_naming_the_setting() -> None:
    with pytest.raises(
        OutboxRowError, match=r"^outbox table public.outbox has no column 'aggregateid' \(key_column\)$"
    ):
        OutboxTable("public.outbox").route({k: v for k, v in ROW.items() if k != "aggregateid"})
    with pytest.raises(OutboxRowError, match="aggregatetype .route_by_column. is null"):
        OutboxTable("public.outbox").route({**ROW, "aggregatetype": None})


def _load(tmp_path: Path, outbox: str) -> object:
    path = tmp_path / "t.toml"
    path.write_text(f'[[sources]]\nname = "shop"\ndsn = "postgresql://u@h/db"\n{outbox}')
    return load_settings(path)


def test_settings_become_the_specs_outbox_tables(tmp_path: Path) -> None:
    settings = _load(tmp_path, '[[sources.outbox]]\ntable = "public.outbox"\nheader_columns = ["tenant"]\n')
    (spec,) = source_specs(settings)  # type: ignore[arg-type]
    assert spec.outbox == (OutboxTable("public.outbox", header_columns=("tenant",)),)
    assert spec.row_exclude == ("public.outbox",)  # never a table's rows


@pytest.mark.parametrize(
    ("entries", "error"),
    [
        ('[[sources.outbox]]\ntable = "outbox"\n', "outbox #1 table"),
        (
            '[[sources.outbox]]\ntable = "public.outbox"\ntopic = "a b.{route}"\n',
            "outbox #1 topic: must be a topic name",
        ),
        (
            '[[sources.outbox]]\ntable = "public.o"\n[[sources.outbox]]\ntable = "public.o"\n',
            "public.o is named by two",
        ),
        ('[[sources.outbox]]\ntabel = "public.o"\n', "unknown key 'tabel'"),
        ('signal_table = "public.o"\n[[sources.outbox]]\ntable = "public.o"\n', "public.o is the signal_table"),
    ],
)
def test_bad_entries_are_one_line_naming_the_key(tmp_path: Path, entries: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, entries)
    assert error in str(caught.value) and "\n" not in str(caught.value)
