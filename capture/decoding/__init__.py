"""Decoding: what the source sends, as values. wal2json messages, column values, LSNs, encodings. Pure."""
