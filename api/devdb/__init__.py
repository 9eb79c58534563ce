"""The embedded PostgreSQL (wal2json, wal_level=logical) for demos, tests and trying it out."""

from tributary.api.devdb.embedded import EmbeddedPostgres, PgError, free_port

__all__ = ["EmbeddedPostgres", "PgError", "free_port"]
