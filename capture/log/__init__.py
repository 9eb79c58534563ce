"""tributary: capture/log."""
