"""Runnable examples; each is also exercised by the tests."""
