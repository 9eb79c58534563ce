"""tributary: capture."""
