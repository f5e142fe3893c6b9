"""Throwaway local Kafka broker (or a cluster of them) and PostgreSQL server.

One launcher, shared by ``kinbox dev``, the tests and the benchmarks.
"""
