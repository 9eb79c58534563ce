"""tributary: api."""
