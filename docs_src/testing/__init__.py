"""Examples of the docs page testing."""
