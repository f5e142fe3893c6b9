"""Every code example of the documentation site, as files the tests under tests/docs run."""
