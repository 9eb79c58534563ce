"""The source database: its catalog, the tables capture follows, the replication connection and the slot."""
