"""Examples of the docs page getting started."""
