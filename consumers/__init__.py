"""Consumer groups: the log as a broker (docs/consumers.md).

A group holds a committed offset per topic-partition in the service database; its live members divide
the partitions (load balancing inside a group, fan-out across groups), rebalanced on join, leave and
missed heartbeats, with generation fencing of stale members. `GroupCoordinator` is the whole server
side, usable in-process (its parts: `membership`, `rebalancing`, `delivery`, `commits`, `overview`);
the HTTP routes (`tributary.api.http.routes_groups`) and the CLI (`tributary groups …`) call it.
`LogChanges` wakes waiting consumers when the log's committed end moves.
"""

from tributary.consumers.assign import TopicPartition, assign
from tributary.consumers.coordinator import GroupCoordinator
from tributary.consumers.datatypes import (
    OFFSET_RESETS,
    Batch,
    Heartbeat,
    Membership,
    OffsetReset,
    ResetTarget,
    StreamCursor,
)
from tributary.consumers.errors import (
    ConsumerError,
    Fenced,
    GroupBusy,
    NotAssigned,
    NotFound,
    OffsetOutOfRange,
    ParkedTopicTaken,
    UnknownMember,
)
from tributary.consumers.waiting import LogChanges

__all__ = [
    "OFFSET_RESETS",
    "Batch",
    "ConsumerError",
    "Fenced",
    "GroupBusy",
    "GroupCoordinator",
    "Heartbeat",
    "LogChanges",
    "Membership",
    "NotAssigned",
    "NotFound",
    "OffsetOutOfRange",
    "ParkedTopicTaken",
    "OffsetReset",
    "ResetTarget",
    "StreamCursor",
    "TopicPartition",
    "UnknownMember",
    "assign",
]
