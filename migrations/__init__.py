"""Alembic migrations of the service database (see alembic.ini)."""
