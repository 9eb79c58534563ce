"""A test domain with personal data: customers (the stream is the subject) and orders (the
subject is the order's `customer_id`). `AGGREGATES` for a config's `[eventstore] modules`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict

from tributary.eventstore.aggregate import Aggregate
from tributary.eventstore.errors import CommandRejected
from tributary.eventstore.personal import PersonalData

__all__ = ["AGGREGATES", "Customer", "customers", "orders"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Register(_Model):
    name: str
    email: str
    age: int | None = None


class ChangeEmail(_Model):
    email: str


class Place(_Model):
    customer_id: str
    address: str
    amount: int


class Registered(_Model):
    name: Annotated[str, PersonalData()]
    email: Annotated[str, PersonalData()]
    age: Annotated[int | None, PersonalData()] = None  # not a string: erased as null
    tier: str = "basic"


class EmailChanged(_Model):
    email: Annotated[str, PersonalData()]


class OrderPlaced(_Model):
    customer_id: str
    address: Annotated[str, PersonalData(subject="customer_id")]
    amount: int


class Customer(_Model):
    registered: bool = False
    name: str = ""
    email: str = ""
    age: int | None = None


class Order(_Model):
    customer_id: str = ""
    address: str = ""
    amount: int = 0


def _decide_customer(state: Customer, command: BaseModel) -> Sequence[BaseModel]:
    if isinstance(command, Register):
        if state.registered:
            raise CommandRejected("register_once", "already registered")
        return [Registered(name=command.name, email=command.email, age=command.age)]
    if isinstance(command, ChangeEmail):
        return [EmailChanged(email=command.email)]
    raise CommandRejected("unknown_command", type(command).__name__)


def _evolve_customer(state: Customer, event: BaseModel) -> Customer:
    update: dict[str, Any] = {}
    if isinstance(event, Registered):
        update = {"registered": True, "name": event.name, "email": event.email, "age": event.age}
    elif isinstance(event, EmailChanged):
        update = {"email": event.email}
    return state.model_copy(update=update)


def customers() -> Aggregate[Customer]:
    return Aggregate(
        stream_type="customer",
        state_type=Customer,
        commands={"register": Register, "change_email": ChangeEmail},
        events=[Registered, EmailChanged],
        decide=_decide_customer,
        evolve=_evolve_customer,
    )


def orders() -> Aggregate[Order]:
    def decide(state: Order, command: BaseModel) -> Sequence[BaseModel]:
        assert isinstance(command, Place)
        return [OrderPlaced(customer_id=command.customer_id, address=command.address, amount=command.amount)]

    def evolve(state: Order, event: BaseModel) -> Order:
        assert isinstance(event, OrderPlaced)
        return Order(customer_id=event.customer_id, address=event.address, amount=event.amount)

    return Aggregate(
        stream_type="order",
        state_type=Order,
        commands={"place": Place},
        events=[OrderPlaced],
        decide=decide,
        evolve=evolve,
    )


AGGREGATES = [customers(), orders()]
