"""A Python consumer for tributary's consumer groups over HTTP (`GET/POST /groups/...`).

```python
from tributary_client import Consumer

with Consumer("http://127.0.0.1:8000", group="billing", topics=["shop.public.orders"]) as consumer:
    for record in consumer:
        handle(record.key, record.value)
        consumer.commit()  # what was yielded so far is done: a restart resumes after it
```

The group divides its topics' partitions among its live members; this client joins, sends
heartbeats from a background thread, rejoins when the group rebalances (a 409 from the server) and
drops the records it still holds of partitions that moved away. Delivery is at-least-once: after a
rebalance or a crash, records after the last commit are delivered again (to whoever owns their
partition then). Within a partition, records arrive in offset order.

`consumer.stream()` yields the same records pushed over server-sent events (one long response, the
lowest latency) instead of long polls; it reconnects by itself with `Last-Event-ID`.

This package is its own distribution, `tributary-client` (it needs only httpx and orjson), with
its own version: a service that only consumes installs it without the rest of tributary.
"""

from tributary_client._consumer import Consumer
from tributary_client._types import (
    CommitFailedError,
    ConsumerError,
    OffsetOutOfRangeError,
    OffsetReset,
    Outcome,
    Record,
    TopicPartition,
)

__version__ = "0.2.0"

__all__ = [
    "CommitFailedError",
    "Consumer",
    "ConsumerError",
    "OffsetOutOfRangeError",
    "OffsetReset",
    "Outcome",
    "Record",
    "TopicPartition",
    "__version__",
]
