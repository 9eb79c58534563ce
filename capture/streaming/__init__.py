"""Streaming: wal2json messages from the slot become records, transaction by transaction, and the positions they reach."""
