"""Members that say no, over HTTP: nack (deliver again after a backoff), park (set aside, the partition
moves on), the group's parked records and their replay (docs/consumers.md, "Saying no")."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from tributary.api.http.auth import AUTH_RESPONSES, error, require
from tributary.api.http.fields import NO_NUL, storable
from tributary.api.http.groups_shared import (
    BODY_ERRORS,
    CONFLICT_ERRORS,
    MAX_INT,
    READ,
    GroupName,
    MemberId,
    Topic,
    run_in_thread,
)
from tributary.api.http.routes_group_delivery import RecordOut, record_json
from tributary.api.http.state import Coordinator

__all__ = ["router"]

router = APIRouter(tags=["consumers"])

NOT_FOUND: dict[int | str, dict[str, Any]] = {404: error("not_found: no such group, or no such record in the log")}


class RecordRef(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topic: Topic
    partition: int = Field(ge=0, le=1_000_000)
    offset: int = Field(ge=0, le=MAX_INT, description="The record's own offset (not the next one).")


class NackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generation: int = Field(ge=0, le=MAX_INT)
    records: list[RecordRef] = Field(min_length=1, max_length=10_000)
    reason: Annotated[str, Field(max_length=2000, pattern=NO_NUL), AfterValidator(storable)] | None = Field(
        default=None, description="Why (kept if the record is parked)."
    )


class ParkRequest(NackRequest):
    reason: Annotated[str, Field(min_length=1, max_length=2000, pattern=NO_NUL), AfterValidator(storable)] = Field(
        description="Why the record is set aside."
    )


class Outcome(BaseModel):
    topic: str
    partition: int
    offset: int
    action: Literal["retry", "parked"]
    attempts: int | None = Field(description="Nacks of the record so far (null: parked directly).")
    retry_in_ms: int | None = Field(default=None, description="When it is delivered again (a retry).")


class SaidNo(BaseModel):
    generation: int
    records: list[Outcome]


class ParkedRecord(BaseModel):
    record: RecordOut = Field(description="The record as the log held it.")
    reason: str
    attempts: int
    parked_at: str
    parked_by: str | None
    state: Literal["parked", "replaying", "replayed"]
    replays: int
    replayed_at: str | None


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    topic: Topic | None = Field(default=None, description="Only this topic's parked records (default: all).")


class ReplayReply(BaseModel):
    group: str
    replaying: int = Field(description="Parked records handed back to the group.")


def _refs(body: NackRequest) -> list[tuple[str, int, int]]:
    return [(r.topic, r.partition, r.offset) for r in body.records]


@router.post(
    "/groups/{group}/members/{member_id}/nack",
    dependencies=READ,
    response_model=SaidNo,
    responses={**AUTH_RESPONSES, **BODY_ERRORS, **CONFLICT_ERRORS, **NOT_FOUND},
)
async def nack(group: GroupName, member_id: MemberId, body: NackRequest, coordinator: Coordinator) -> dict[str, Any]:
    """Deliver these records again after a backoff: their partition goes back to the earliest of
    them (the records after it follow again, in order). Past the member's `max_retries` a record is
    parked instead. A commit never passes a nacked record before it was delivered again."""
    done = await run_in_thread(coordinator.nack, group, member_id, body.generation, _refs(body), reason=body.reason)
    return {"generation": body.generation, "records": done}


@router.post(
    "/groups/{group}/members/{member_id}/park",
    dependencies=READ,
    response_model=SaidNo,
    responses={**AUTH_RESPONSES, **BODY_ERRORS, **CONFLICT_ERRORS, **NOT_FOUND},
)
async def park(group: GroupName, member_id: MemberId, body: ParkRequest, coordinator: Coordinator) -> dict[str, Any]:
    """Set these records aside in the group's parked records, with `reason`: their partition moves on
    (commit past them as usual)."""
    done = await run_in_thread(coordinator.park, group, member_id, body.generation, _refs(body), reason=body.reason)
    return {"generation": body.generation, "records": done}


def parked_json(row: dict[str, Any]) -> bytes:
    """A parked record as `GET …/parked` and `tributary groups parked --json` show it."""
    return orjson.dumps(
        {
            "record": orjson.Fragment(record_json(row["record"])),
            **{k: v for k, v in row.items() if k != "record"},
        }
    )


@router.get(
    "/groups/{group}/parked",
    dependencies=READ,
    response_class=Response,
    responses={
        200: {"model": list[ParkedRecord], "description": "oldest first"},
        **AUTH_RESPONSES,
        404: error("no such group"),
    },
)
async def parked(
    group: GroupName,
    coordinator: Coordinator,
    state: Annotated[Literal["parked", "replaying", "replayed"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> Response:
    """The group's parked records (KurrentDB's parked messages), oldest first: the original record,
    why, how many attempts, and whether it was replayed."""
    rows = await run_in_thread(coordinator.parked, group, state=state, limit=limit)
    return Response(b"[" + b",".join(parked_json(r) for r in rows) + b"]", media_type="application/json")


@router.post(
    "/groups/{group}/parked/replay",
    dependencies=[Depends(require("admin"))],
    response_model=ReplayReply,
    responses={**AUTH_RESPONSES, **BODY_ERRORS, 404: error("no such group")},
)
async def replay(group: GroupName, coordinator: Coordinator, body: ReplayRequest | None = None) -> dict[str, Any]:
    """Hand the group's parked records back to it: each goes to the member holding its partition,
    before that partition's next records, and becomes `replayed` when that member commits the
    partition (a nack or a park parks it again)."""
    n = await run_in_thread(coordinator.replay_parked, group, topic=body.topic if body else None)
    return {"group": group, "replaying": n}
