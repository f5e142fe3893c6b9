"""Examples of the docs page failures."""
