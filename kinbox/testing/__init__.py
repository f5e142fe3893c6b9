"""Testing apps and handlers: fakes of the seams.

Without any server: :class:`FakeStore` stands in for the PostgreSQL inbox
store, :class:`FakeTransport` for the Kafka consumer and
:class:`FakePublisher` for the dead-letter producer; :func:`record` builds a
record carrying an event id. Each has knobs that make it fail the way the
real one does (see their docstrings), and one contract suite
(``tests/contract``) checks that they behave like the real implementations.

The names load on first use (PEP 562): importing this package loads
neither psycopg nor a Kafka client.
"""

from typing import TYPE_CHECKING

from kinbox.lazy import exports as _exports

if TYPE_CHECKING:
    from kinbox.testing.publisher import FakePublisher
    from kinbox.testing.store import FakeConn, FakeStore, FakeTransaction, postgres_accepts
    from kinbox.testing.transport import FakeTransport, record

__all__ = [
    "FakeConn",
    "FakePublisher",
    "FakeStore",
    "FakeTransaction",
    "FakeTransport",
    "postgres_accepts",
    "record",
]

# Where each public name lives; __getattr__ imports it from there on first use.
_SOURCES = {
    "FakeConn": "kinbox.testing.store",
    "FakePublisher": "kinbox.testing.publisher",
    "FakeStore": "kinbox.testing.store",
    "FakeTransaction": "kinbox.testing.store",
    "FakeTransport": "kinbox.testing.transport",
    "postgres_accepts": "kinbox.testing.store",
    "record": "kinbox.testing.transport",
}

__getattr__, __dir__ = _exports(__name__, _SOURCES)
