"""kinbox: exactly-once database effects for Kafka consumers on PostgreSQL.

Register handlers with :func:`handler` (or :meth:`App.handler`), run them with
``kinbox worker module[:app]``; see the README for the guarantees.

The names below load on first use (PEP 562), so importing one submodule —
``kinbox.errors`` from ``producer_outbox``, say — does not drag in the
consumer's modules, confluent-kafka or OpenTelemetry.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kinbox.app import App, default_app, handler
    from kinbox.apply.route import Route
    from kinbox.config import Settings
    from kinbox.consume.envelope import Record
    from kinbox.errors import (
        ConfigurationError,
        DeadLetter,
        EnvelopeError,
        FatalTransportError,
        KinboxError,
        PayloadError,
        Retry,
        SchemaError,
        ServiceError,
        StoreError,
        TransportError,
    )
    from kinbox.event import Event
    from kinbox.middleware.base import Middleware

__all__ = [
    "App",
    "ConfigurationError",
    "DeadLetter",
    "EnvelopeError",
    "Event",
    "FatalTransportError",
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
    "TransportError",
    "default_app",
    "handler",
]

# Where each public name lives; __getattr__ imports it from there on first use.
_SOURCES = {
    "App": "kinbox.app",
    "ConfigurationError": "kinbox.errors",
    "DeadLetter": "kinbox.errors",
    "EnvelopeError": "kinbox.errors",
    "Event": "kinbox.event",
    "FatalTransportError": "kinbox.errors",
    "KinboxError": "kinbox.errors",
    "Middleware": "kinbox.middleware.base",
    "PayloadError": "kinbox.errors",
    "Record": "kinbox.consume.envelope",
    "Retry": "kinbox.errors",
    "Route": "kinbox.apply.route",
    "SchemaError": "kinbox.errors",
    "ServiceError": "kinbox.errors",
    "Settings": "kinbox.config",
    "StoreError": "kinbox.errors",
    "TransportError": "kinbox.errors",
    "default_app": "kinbox.app",
    "handler": "kinbox.app",
}


def __getattr__(name: str) -> Any:
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module 'kinbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
