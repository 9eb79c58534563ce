"""The HTTP API (FastAPI): commands, streams, views, admin, metrics and the console page."""
