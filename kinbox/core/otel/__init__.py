"""OpenTelemetry pieces the worker and the outbox relay share (neither's stage code).

================  ================================================================
``semconv``       every span, attribute and instrument name (the conventions', then kinbox's)
``instruments``   instruments from those names; is an SDK listening at all?
``propagation``   W3C trace context in Kafka headers: a record's creation context
``setup``         configure the SDK from ``OTEL_*`` at process start (and ``--metrics-port``)
================  ================================================================
"""
