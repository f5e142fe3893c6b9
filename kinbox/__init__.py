"""kinbox: exactly-once database effects for Kafka consumers on PostgreSQL.

Register handlers with :func:`handler` (or :meth:`App.handler`), run them with
``kinbox worker module[:app]``; see the README for the guarantees.

The layout follows a record through the worker::

    kafka.base ──► consume ──────────► apply ──────────────► store.base
    (seam)         envelope, runner,   route, kinds, batch,   (seam)
    kafka.*        inflight, offsets,  dispatch, narrow,      store.postgres,
    (confluent-    backoff, breaker    deadletter, policy,    errors, schema,
     kafka)                            outcome                migrations,
                                                              retention (psycopg)

================  ==============================================================
``app``           :class:`App`, :func:`handler`: the registry (no I/O)
``event``         :class:`Event`, what a handler receives
``config``        :class:`Settings`: flags > env > app > defaults
``errors``        the one error tree (shared with ``producer_outbox``)
``names``         identifier and topic-name validation (shared)
``failpoints``    crash points for the fault tests, one grammar (shared)
``lazy``          names that load on first use, for ``__init__`` files (shared)
``describe``      exceptions and values as safe, bounded text
``validators``    typed payloads validated by pydantic (the ``pydantic`` extra)
``cause``         which inbox event a handler works for, read by ``enqueue`` (shared)
``traceparent``   the W3C trace id of a record, stored by the claim
``consume/``      the poll loop, up to a partition batch: driver-free
``apply/``        one partition batch in one transaction: driver-free
``store/``        the inbox store seam and PostgreSQL behind it
``kafka/``        the Kafka seam and confluent-kafka behind it
``params/``       what a handler's parameters get: typed payloads, sessions (driver-free)
``middleware/``   layers around workers, batches and handler calls; telemetry
``otel/``         OpenTelemetry names, W3C trace context, the SDK from ``OTEL_*`` (shared)
``ops/``          the worker process: signals, shutdown, ``--processes N``;
                  health endpoints, status, explain, retention guards, logs
``cli/``          the ``kinbox`` command, one module per command group
``testing/``      the test client, the redelivery check, the pytest plugin, fakes
``devstack/``     the local Kafka + PostgreSQL (+ Connect) launcher
``bench/``        the benchmark harness behind ``kinbox bench``
================  ==============================================================

Only ``kafka/`` imports confluent-kafka, only ``store/`` (and
``producer_outbox``) psycopg, only ``otel/`` and the telemetry middleware
(and ``producer_outbox``'s trace context) OpenTelemetry;
``tests/unit/test_layering.py`` checks that the core loads none of them and
that no import circle forms.

The names below load on first use (PEP 562), so importing one submodule —
``kinbox.core.errors`` from ``producer_outbox``, say — does not drag in the
consumer's modules, confluent-kafka or OpenTelemetry.
"""

from typing import TYPE_CHECKING

from kinbox.core.lazy import exports as _exports

if TYPE_CHECKING:
    from kinbox.app import App, default_app, handler
    from kinbox.apply.route import Route
    from kinbox.core.cause import caused_by
    from kinbox.core.config import Settings
    from kinbox.core.errors import (
        ConfigurationError,
        DeadLetter,
        EnvelopeError,
        FatalTransportError,
        HandlerAborted,
        HandlerCancelled,
        InvalidPayload,
        KinboxError,
        PayloadError,
        Retry,
        SchemaError,
        ServiceError,
        StoreError,
        TransactionControlError,
        TransportError,
    )
    from kinbox.core.event import Event
    from kinbox.core.record import Record
    from kinbox.middleware.base import Middleware

__all__ = [
    "App",
    "ConfigurationError",
    "DeadLetter",
    "EnvelopeError",
    "Event",
    "FatalTransportError",
    "HandlerAborted",
    "HandlerCancelled",
    "InvalidPayload",
    "KinboxError",
    "Middleware",
    "PayloadError",
    "Record",
    "Retry",
    "Route",
    "SchemaError",
    "ServiceError",
    "Settings",
    "StoreError",
    "TransactionControlError",
    "TransportError",
    "caused_by",
    "default_app",
    "handler",
]

# Where each public name lives; __getattr__ imports it from there on first use.
_SOURCES = {
    "App": "kinbox.app",
    "ConfigurationError": "kinbox.core.errors",
    "DeadLetter": "kinbox.core.errors",
    "EnvelopeError": "kinbox.core.errors",
    "Event": "kinbox.core.event",
    "FatalTransportError": "kinbox.core.errors",
    "HandlerAborted": "kinbox.core.errors",
    "HandlerCancelled": "kinbox.core.errors",
    "InvalidPayload": "kinbox.core.errors",
    "KinboxError": "kinbox.core.errors",
    "Middleware": "kinbox.middleware.base",
    "PayloadError": "kinbox.core.errors",
    "Record": "kinbox.core.record",
    "Retry": "kinbox.core.errors",
    "Route": "kinbox.apply.route",
    "SchemaError": "kinbox.core.errors",
    "ServiceError": "kinbox.core.errors",
    "Settings": "kinbox.core.config",
    "StoreError": "kinbox.core.errors",
    "TransactionControlError": "kinbox.core.errors",
    "TransportError": "kinbox.core.errors",
    "caused_by": "kinbox.core.cause",
    "default_app": "kinbox.app",
    "handler": "kinbox.app",
}

__getattr__, __dir__ = _exports(__name__, _SOURCES)
