"""Testing apps and handlers: fakes of the seams, and the real inbox without a broker.

Without any server: :class:`FakeStore` stands in for the PostgreSQL inbox
store, :class:`FakeTransport` for the Kafka consumer and
:class:`FakePublisher` for the dead-letter producer; :func:`record` builds a
record carrying an event id. :class:`InlineExecutor` makes the runner
apply each batch on the polling thread, so a test can step it turn by turn.
Each has knobs that make it fail the way the
real one does (see their docstrings), and one contract suite
(``tests/contract``) checks that they behave like the real implementations.

Against a real PostgreSQL, with no Kafka: :class:`InboxTestClient` delivers
:class:`Message` s to an app's handlers through the worker's own claim and
transaction code and returns a :class:`DeliveryResult` per record;
:func:`assert_redelivery_safe` checks that redelivering events, with crashes
and retries injected, leaves the database as one clean delivery does. The
pytest plugin (:mod:`kinbox.testing.pytest_plugin`, registered on install)
provides the fixtures ``kinbox_database_url`` and ``inbox_client``.

The names load on first use (PEP 562): importing this package, as pytest does
for the plugin, loads neither psycopg nor a Kafka client.
"""

from typing import TYPE_CHECKING

from kinbox.core.lazy import exports as _exports

if TYPE_CHECKING:
    from kinbox.testing.client import InboxTestClient
    from kinbox.testing.executor import InlineExecutor
    from kinbox.testing.messages import Message
    from kinbox.testing.publisher import FakePublisher
    from kinbox.testing.redelivery import assert_redelivery_safe
    from kinbox.testing.report import SCENARIOS, Difference, RedeliveryReport, RedeliveryUnsafe
    from kinbox.testing.results import DeliveryResult, FailedTry
    from kinbox.testing.store import FakeConn, FakeStore, FakeTransaction, postgres_accepts
    from kinbox.testing.transport import FakeTransport, record

__all__ = [
    "SCENARIOS",
    "DeliveryResult",
    "Difference",
    "FailedTry",
    "FakeConn",
    "FakePublisher",
    "FakeStore",
    "FakeTransaction",
    "FakeTransport",
    "InboxTestClient",
    "InlineExecutor",
    "Message",
    "RedeliveryReport",
    "RedeliveryUnsafe",
    "assert_redelivery_safe",
    "postgres_accepts",
    "record",
]

# Where each public name lives; __getattr__ imports it from there on first use.
_SOURCES = {
    "SCENARIOS": "kinbox.testing.report",
    "DeliveryResult": "kinbox.testing.results",
    "Difference": "kinbox.testing.report",
    "FailedTry": "kinbox.testing.results",
    "FakeConn": "kinbox.testing.store",
    "FakePublisher": "kinbox.testing.publisher",
    "FakeStore": "kinbox.testing.store",
    "FakeTransaction": "kinbox.testing.store",
    "FakeTransport": "kinbox.testing.transport",
    "InboxTestClient": "kinbox.testing.client",
    "InlineExecutor": "kinbox.testing.executor",
    "Message": "kinbox.testing.messages",
    "RedeliveryReport": "kinbox.testing.report",
    "RedeliveryUnsafe": "kinbox.testing.report",
    "assert_redelivery_safe": "kinbox.testing.redelivery",
    "postgres_accepts": "kinbox.testing.store",
    "record": "kinbox.testing.transport",
}

__getattr__, __dir__ = _exports(__name__, _SOURCES)
