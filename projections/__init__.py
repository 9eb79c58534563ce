"""Projections: deterministic folds of the log into derived tables in the service database."""
