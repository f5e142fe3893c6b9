"""kinbox: exactly-once database effects for Kafka consumers on PostgreSQL.

Register handlers with :func:`handler` (or :meth:`App.handler`), run them with
``kinbox worker module[:app]``; ``docs/concepts.md`` says what is guaranteed.

The packages stand on floors, and an import never runs back up
(``tests/unit/test_layering.py`` checks it, counting the imports inside
functions and under ``TYPE_CHECKING``):

=======  ===================================================================
roof     ``entry``: the ``kinbox`` command (and ``python -m kinbox``), the
         shell's group with the tools' commands (``dev``, ``bench``) on it
tools    ``testing/`` (the test client, fakes, the pytest plugin),
         ``devstack/`` (local Kafka + PostgreSQL), ``bench/``; nothing
         below imports them
shell    ``ops/`` (the worker and relay processes; status, explain and the
         retention guards, where inbox and outbox meet) < ``console/`` <
         ``cli/`` (every command, the outbox's too)
outbox   :mod:`producer_outbox`, a library (writer, relay, CDC): it imports
         the core and the drivers only
drivers  ``kafka/`` (confluent-kafka) and ``store/`` (PostgreSQL): each
         implements seams of the core, and neither imports the other
engine   ``params/``, ``middleware/`` < ``apply/`` < ``app`` < ``consume/``,
         and this module, the public face
core     ``core/``: what every floor shares (the error tree, Event, Record,
         Settings, a batch's outcome, dead letters, the failure policy) and
         the seams (Transport, Publisher, InboxStore)
=======  ===================================================================

A record's walk through the worker::

    core.transport ──► consume/ ───────────► apply/ ─────────────► core.inbox
    (KafkaTransport)   runner: poll, split   envelope: the event   (PostgresInbox-
                       by partition, lanes,  batch: claim, call    Store)
                       offsets, backoff      the handlers, dead
                                             letters, COMMIT

Only ``kafka/`` imports confluent-kafka, only ``store/`` (and
``producer_outbox``) psycopg, only ``core/otel/`` and the telemetry
middleware (and ``producer_outbox``'s trace context) OpenTelemetry.

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
