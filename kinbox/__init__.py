"""kinbox: exactly-once database effects for Kafka consumers on PostgreSQL.

Register handlers with :func:`handler` (or :meth:`App.handler`), run them with
``kinbox worker module[:app]``; see the README for the guarantees.
"""

from kinbox.app import App, Route, default_app, handler
from kinbox.config import Settings
from kinbox.envelope import Record
from kinbox.errors import (
    ConfigurationError,
    DeadLetter,
    EnvelopeError,
    KinboxError,
    Retry,
    SchemaError,
    StoreError,
    TransportError,
)
from kinbox.event import Event

__all__ = [
    "App",
    "ConfigurationError",
    "DeadLetter",
    "EnvelopeError",
    "Event",
    "KinboxError",
    "Record",
    "Retry",
    "Route",
    "SchemaError",
    "Settings",
    "StoreError",
    "TransportError",
    "default_app",
    "handler",
]
