"""Records: what capture emits. Envelopes and keys, topics, schema records, the outbox's events, and staging into the log."""
