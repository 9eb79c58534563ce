"""Example domains shipped with tributary."""
