"""Benchmarks: they print figures and ratios; tests never assert speed."""
