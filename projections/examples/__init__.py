"""Example projections shipped with tributary (name them in `[projections] modules`)."""
