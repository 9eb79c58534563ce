"""tributary: change-data capture and event sourcing on PostgreSQL.

The repository's top-level folders install as sub-packages of this one: `tributary.capture`
(replication, snapshot), `tributary.log` (the log: its local and Kafka backends),
`tributary.eventstore`, `tributary.projections`, `tributary.api` and `tributary.migrations`.
"""

__version__ = "0.1.0"
