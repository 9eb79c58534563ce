"""Configuration (`tributary.toml` + environment), its reference, logging and the wiring of sources."""
