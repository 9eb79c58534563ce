"""Request field checks the routes share: values the database can store, integers that are not
booleans, stated in the OpenAPI document where a schema can say them."""

from __future__ import annotations

from tributary.eventstore.values import text_problem

__all__ = ["NO_NUL", "no_bool", "storable"]

NO_NUL = r"^[^\x00]*$"  # the store's text cannot hold a NUL: refused as the schema says, not by the database


def no_bool(value: object) -> object:
    """JSON's `true`/`false` are no integers (pydantic would take them for 1 and 0); 3.0 is one.
    A `BeforeValidator` placed after a field's bounds (`Annotated[int, Field(ge=…), BeforeValidator(no_bool)]`),
    so the OpenAPI document still states them."""
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    return value


def storable(value: str) -> str:
    """An `AfterValidator` for text the database stores (`eventstore.values.text_problem`: no NUL,
    no unpaired UTF-16 surrogate); the schema states the NUL rule as a pattern (`NO_NUL`)."""
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value
