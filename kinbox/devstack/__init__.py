"""Throwaway local Kafka broker and PostgreSQL server.

One launcher, shared by ``kinbox dev``, the tests and the benchmarks.
"""
