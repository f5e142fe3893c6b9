"""Tools that build parts of the documentation site from the code (not shipped in the wheel)."""
