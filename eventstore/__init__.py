"""tributary: eventstore."""
