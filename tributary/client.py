"""The Python consumer, kept importable here for existing code: it lives in its own distribution,
`tributary-client` (import name `tributary_client`, in the repository's `client/` folder), which a
service that only consumes installs without the rest of tributary. New code imports
`tributary_client`; `from tributary.client import Consumer` goes on working."""

from tributary_client import (
    CommitFailedError,
    Consumer,
    ConsumerError,
    OffsetOutOfRangeError,
    OffsetReset,
    Outcome,
    Record,
    TopicPartition,
)

__all__ = [
    "CommitFailedError",
    "Consumer",
    "ConsumerError",
    "OffsetOutOfRangeError",
    "OffsetReset",
    "Outcome",
    "Record",
    "TopicPartition",
]
