"""What the consumer-group routes share: the path and body fields, running a coordinator call in a worker thread, and the error body of the consumers' errors."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Path
from pydantic import BaseModel, Field

from tributary.api.http.auth import error, require
from tributary.api.http.problems import Problem, problem_body
from tributary.consumers import (
    ConsumerError,
    Fenced,
    GroupBusy,
    NotAssigned,
    NotFound,
    OffsetOutOfRange,
    ParkedTopicTaken,
    UnknownMember,
)
from tributary.jsonvalue import JsonObject
from tributary.log import LogError

__all__ = [
    "BODY_ERRORS",
    "CONFLICT_ERRORS",
    "MAX_INT",
    "READ",
    "Assignment",
    "GroupName",
    "MemberId",
    "Topic",
    "assignments_json",
    "consumer_problem",
    "consumer_status",
    "error_members",
    "run_in_thread",
]

T = TypeVar("T")

NAME_PATTERN = r"^[A-Za-z0-9._:@+=-]{1,200}$"
TOPIC_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,248}$"  # the log's own rule for topic names
MAX_INT = 2**53 - 1  # offsets and generations: exact as a JSON number (a double)
Topic = Annotated[str, Field(pattern=TOPIC_PATTERN, description="A topic of the log, e.g. `shop.public.orders`.")]
GroupName = Annotated[str, Path(pattern=NAME_PATTERN, description="The consumer group's name.")]
MemberId = Annotated[str, Path(pattern=NAME_PATTERN, description="The id `POST /groups/{group}/members` returned.")]
READ = [Depends(require("read"))]


class Assignment(BaseModel):
    topic: str
    partition: int


BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    400: error("the body is not JSON"),
    413: error("the body is larger than [api] max_body_bytes"),
    422: error("invalid request"),
}
CONFLICT_ERRORS: dict[int | str, dict[str, Any]] = {
    409: error("fenced (a rebalance happened), unknown_member (join again) or not_assigned: see `code`")
}


async def run_in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn` in a worker thread; a log that cannot be read as it is (e.g. its manifest vanished) is a 503
    with the log's one-line message, which says how to repair it."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except LogError as exc:
        raise Problem(503, "log_unreadable", str(exc)) from None


def assignments_json(tps: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p} for t, p in tps]


def consumer_status(exc: ConsumerError) -> int:
    """The one mapping of the consumers' errors to HTTP: 409 for membership, fencing and a parked
    topic another writer has, 410 past retention, 404 for a topic or group that is not there, 422
    for the rest."""
    if isinstance(exc, UnknownMember | Fenced | NotAssigned | GroupBusy | ParkedTopicTaken):
        return 409
    if isinstance(exc, OffsetOutOfRange):
        return 410
    if isinstance(exc, NotFound):
        return 404
    return 422


def consumer_problem(exc: ConsumerError) -> JsonObject:
    """A consumers' error as a problem body (also what a stream's `error` event carries)."""
    return problem_body(consumer_status(exc), getattr(exc, "code", "invalid"), str(exc), **error_members(exc))


def error_members(exc: ConsumerError) -> JsonObject:
    """The problem members of a consumers' error beyond its `code` and message."""
    members: JsonObject = {}
    if isinstance(exc, UnknownMember | Fenced | NotAssigned):
        members["generation"] = exc.generation
    if isinstance(exc, OffsetOutOfRange):
        members |= {"topic": exc.topic, "partition": exc.partition, "position": exc.position, "start": exc.start}
    return members
