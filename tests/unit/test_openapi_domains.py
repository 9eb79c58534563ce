"""Each loaded stream type's commands and events in the OpenAPI document, as JSON Schemas."""

from __future__ import annotations

from typing import Any

import pytest

from tributary.api.http.app import create_app
from tributary.api.settings.config import EventStoreSettings, Settings

pytestmark = pytest.mark.unit

REF = "#/components/schemas/"


def document(*modules: str) -> dict[str, Any]:
    settings = Settings(eventstore=EventStoreSettings(modules=modules))
    app = create_app(settings, dsn="postgresql://unused.invalid/none")  # never started: no database
    return app.openapi()


def resolve(doc: dict[str, Any], ref: str) -> dict[str, Any]:
    assert ref.startswith(REF), ref
    return doc["components"]["schemas"][ref.removeprefix(REF)]  # type: ignore[no-any-return]


def test_a_stream_type_has_its_command_path_with_a_discriminated_union_of_its_commands() -> None:
    doc = document("tests.domains.tally")
    op = doc["paths"]["/commands/tally/{stream_id}"]["post"]
    assert [p["name"] for p in op["parameters"]] == ["stream_id"]
    union = resolve(doc, op["requestBody"]["content"]["application/json"]["schema"]["$ref"])
    assert union["discriminator"]["propertyName"] == "type"
    assert set(union["discriminator"]["mapping"]) == {"add", "close"}
    add = resolve(doc, union["discriminator"]["mapping"]["add"])
    assert add["properties"]["type"]["const"] == "add" and add["additionalProperties"] is False
    assert {"expected_version", "command_id"} <= set(add["properties"])
    assert add["required"] == ["type", "data"]
    data = resolve(doc, add["properties"]["data"]["$ref"])
    assert data["properties"]["n"] == {"maximum": 1000, "minimum": 1, "title": "N", "type": "integer"}
    assert data["required"] == ["n"] and data["additionalProperties"] is False
    close = resolve(doc, union["discriminator"]["mapping"]["close"])
    assert close["required"] == ["type"]  # a command without required fields may leave `data` out
    # the generic route stays, with its errors
    assert "404" in doc["paths"]["/commands/{stream_type}/{stream_id}"]["post"]["responses"]
    assert {"409", "422", "503"} <= set(op["responses"])


def test_the_events_are_components_and_type_the_reply() -> None:
    doc = document("tests.domains.tally")
    op = doc["paths"]["/commands/tally/{stream_id}"]["post"]
    reply = resolve(doc, op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"])
    events = resolve(doc, reply["properties"]["events"]["items"]["$ref"])
    assert set(events["discriminator"]["mapping"]) == {"Added", "Closed"}
    added = resolve(doc, events["discriminator"]["mapping"]["Added"])
    assert added["properties"]["type"]["const"] == "Added"
    assert {"id", "stream", "version", "position", "schema_version", "metadata"} <= set(added["properties"])
    added_data = resolve(doc, added["properties"]["data"]["$ref"])
    assert set(added_data["properties"]) == {"n", "note"}
    assert "tally.Tally" not in doc["components"]["schemas"]  # the state is not part of the contract


def test_two_domains_with_models_of_one_name_do_not_collide() -> None:
    doc = document("tests.domains.tally", "tributary.eventstore.examples.bank")
    schemas = doc["components"]["schemas"]
    assert {"tally.Close", "account.Close", "tally.Command", "account.Command"} <= set(schemas)
    assert schemas["tally.Close"] is not schemas["account.Close"]
    assert "/commands/account/{stream_id}" in doc["paths"] and "/commands/tally/{stream_id}" in doc["paths"]


def test_no_modules_no_stream_type_paths() -> None:
    doc = document()
    assert [p for p in doc["paths"] if p.startswith("/commands/")] == ["/commands/{stream_type}/{stream_id}"]
