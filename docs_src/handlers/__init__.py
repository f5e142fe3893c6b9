"""Examples of the docs page handlers."""
