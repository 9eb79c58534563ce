"""Personal-data fields, pure: which fields are marked, sealing, revealing, erasing."""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import pytest
from pydantic import BaseModel

from tests.domains.customers import EmailChanged, OrderPlaced, Registered, customers
from tributary.eventstore.aggregate import Aggregate
from tributary.eventstore.errors import AggregateDefinitionError
from tributary.eventstore.forget import projections_reading
from tributary.eventstore.personal import (
    ERASED,
    PersonalData,
    personal_fields,
    reveal,
    seal,
    sealed_keys,
    subjects_of,
)

pytestmark = pytest.mark.unit

KEY_1, KEY_2 = os.urandom(32), os.urandom(32)


def _sealed(model: type[BaseModel], data: dict[str, Any], stream: str = "c-1") -> dict[str, Any]:
    fields = personal_fields(model)
    return seal(fields, data, stream, {s: (1, KEY_1) for s in subjects_of(fields, data, stream)})


def test_marked_fields_their_subject_and_erased_value() -> None:
    assert [(f.name, f.subject, f.erased) for f in personal_fields(Registered)] == [
        ("name", None, ERASED),
        ("email", None, ERASED),
        ("age", None, None),  # an int accepts no "<erased>": null
    ]
    assert [(f.name, f.subject) for f in personal_fields(OrderPlaced)] == [("address", "customer_id")]


def test_sealed_data_holds_no_plaintext_and_reveals_with_the_key() -> None:
    data = {"name": "Zoë Quayle-Bright", "email": "zoe@example.org", "age": 41, "tier": "gold"}
    sealed = _sealed(Registered, data)
    text = json.dumps(sealed)
    assert "Quayle" not in text and "zoe@" not in text
    assert sealed["tier"] == "gold"
    assert sealed["name"]["$enc"] == "v1" and sealed["name"]["subject"] == "c-1" and sealed["name"]["kid"] == 1
    assert sealed_keys(sealed) == {("c-1", 1)}
    assert reveal(sealed, {("c-1", 1): KEY_1}.get) == data


def test_without_the_key_the_fields_read_as_erased_and_still_validate() -> None:
    sealed = _sealed(Registered, {"name": "Zoë", "email": "z@example.org", "age": 41, "tier": "gold"})
    erased = reveal(sealed, {}.get)
    assert erased == {"name": ERASED, "email": ERASED, "age": None, "tier": "gold"}
    Registered.model_validate(erased)
    # a key of the same id that is not the original (made after it was destroyed) opens nothing
    assert reveal(sealed, {("c-1", 1): KEY_2}.get) == erased


def test_the_subject_can_be_another_field() -> None:
    sealed = _sealed(OrderPlaced, {"customer_id": "c-9", "address": "1 Elm Row", "amount": 3}, stream="o-1")
    assert sealed["address"]["subject"] == "c-9" and sealed_keys(sealed) == {("c-9", 1)}


def test_a_marker_that_cannot_be_erased_is_refused_when_the_aggregate_is_built() -> None:
    class Bad(BaseModel):
        age: Annotated[int, PersonalData()]  # neither "<erased>" nor null validates

    class Ok(BaseModel):
        age: Annotated[int, PersonalData(erased=0)]

    agg = customers()

    def build(event: type[BaseModel]) -> Aggregate[Any]:
        return Aggregate(
            stream_type="x",
            state_type=agg.state_type,
            commands=agg.commands,
            events=[event, EmailChanged],
            decide=agg.decide,
            evolve=agg.evolve,
        )

    with pytest.raises(AggregateDefinitionError, match="Bad.age: the erased value None does not validate"):
        build(Bad)
    build(Ok)
    assert personal_fields(Ok)[0].erased == 0


def test_a_forget_rebuilds_the_projections_reading_the_subjects_stream_types() -> None:
    defined = [
        ("contacts", ("events.customer", "events.order")),
        ("orders", ("events.order",)),
        ("accounts", ("events.account",)),
        ("cdc", ("shop.public.customer",)),
    ]
    assert projections_reading(defined, {"customer"}) == ["contacts"]
    assert projections_reading(defined, {"order", "customer"}) == ["contacts", "orders"]
    assert projections_reading(defined, set()) == []


def test_a_marker_inside_a_nested_model_is_refused_not_ignored() -> None:
    class Address(BaseModel):
        street: Annotated[str, PersonalData()]

    class Moved(BaseModel):
        address: Address

    class MovedMarked(BaseModel):
        address: Annotated[Address | None, PersonalData()]

    with pytest.raises(ValueError, match="Moved.address: Address marks personal data inside it"):
        personal_fields(Moved)
    assert [(f.name, f.erased) for f in personal_fields(MovedMarked)] == [("address", None)]
