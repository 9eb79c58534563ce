"""The log: where capture writes and every reader reads, behind one set of contracts.

Two backends: `tributary.log.local` (tributary's own segment log on one machine's disk, docs/log.md)
and `tributary.log.kafka` (an existing Kafka cluster, docs/kafka.md). This layer imports nothing
from capture, the event store, projections, consumers, sinks or the API: they build on it.
"""
