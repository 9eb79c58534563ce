"""A nack's or park's `reason` is stored in the service database: text it cannot hold (a NUL, an
unpaired UTF-16 surrogate) is refused as a request error, never reaching PostgreSQL (a 500)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tributary.api.http.routes_group_parked import NackRequest, ParkRequest

pytestmark = pytest.mark.unit

RECORD = {"topic": "shop.public.orders", "partition": 0, "offset": 1}


@pytest.mark.parametrize("model", [NackRequest, ParkRequest])
@pytest.mark.parametrize("reason", ["bad\x00byte", "half \ud83d pair"])
def test_a_reason_the_database_cannot_store_is_refused(model: type[NackRequest], reason: str) -> None:
    with pytest.raises(ValidationError):
        model.model_validate({"generation": 1, "records": [RECORD], "reason": reason})


@pytest.mark.parametrize("model", [NackRequest, ParkRequest])
def test_a_plain_reason_is_taken(model: type[NackRequest]) -> None:
    assert model.model_validate({"generation": 1, "records": [RECORD], "reason": "poison: ünïcode ok"}).reason
