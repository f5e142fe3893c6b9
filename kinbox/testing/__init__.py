"""Test doubles for kinbox's seams, to test handlers and apps without a broker or a server.

:class:`FakeStore` stands in for the PostgreSQL inbox store,
:class:`FakeTransport` for the Kafka consumer and :class:`FakePublisher` for
the dead-letter producer; :func:`record` builds a record carrying an event id.
:class:`InlineExecutor` makes the runner apply each batch on the polling
thread, so a test can step it turn by turn.
Each has knobs that make it fail the way the real one does (see their
docstrings), and one contract suite (``tests/contract``) checks that they
behave like the real implementations. Importing this package loads no Kafka
client (the fake store uses psycopg's exception classes, to classify the
errors a handler raises exactly as the real store does).
"""

from kinbox.testing.executor import InlineExecutor
from kinbox.testing.publisher import FakePublisher
from kinbox.testing.store import FakeConn, FakeStore, FakeTransaction, postgres_accepts
from kinbox.testing.transport import FakeTransport, record

__all__ = [
    "FakeConn",
    "FakePublisher",
    "FakeStore",
    "FakeTransaction",
    "FakeTransport",
    "InlineExecutor",
    "postgres_accepts",
    "record",
]
