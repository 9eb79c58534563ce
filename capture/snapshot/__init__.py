"""Snapshots: the initial one inside the slot's exported snapshot, chunked ones beside the stream, and the signals that ask for them."""
