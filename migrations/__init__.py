"""tributary: migrations."""
