"""`tributary demo`: everything on the embedded default, with a sample shop schema and workload."""
