"""Domains written for the test suite (loaded like a user's `[eventstore] modules`)."""
