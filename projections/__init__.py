"""tributary: projections."""
