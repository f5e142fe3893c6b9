"""producer_outbox: a transactional outbox writer and relay for PostgreSQL and Kafka.

Write with :func:`enqueue` (or :func:`enqueue_async` on an ``AsyncConnection``)
inside your business transaction; run
``kinbox outbox relay`` to publish. Never imports kinbox's consumer code.

The names below load on first use (PEP 562), so a service that only writes
(``from producer_outbox import enqueue``) loads psycopg and the writer, and
nothing of Kafka or the relay.

The modules, along the flow of a row:

==================  ==========================================================
``writer``          :func:`enqueue`: a row in the caller's transaction, NOTIFY
``trace_context``   the W3C trace context a row carries from enqueue to the record
``schema``          the outbox's tables, as versioned migration steps
``relay``           :class:`Relay`: its lane groups side by side; ``config``
``group``           a lane group: the loop, claim, send, mark as reports come;
                    ``shared`` what the groups tell each other
``lane_locks``      several relays share the outbox without reordering a key
``claim``           the relay's SQL: the next batch in per-key order, marking
``flight``          rows sent and not yet settled: the keys they hold back
``records``         rows and the Kafka records made of them (no I/O)
``producer``        the relay's producer settings; it publishes through
                    :class:`KafkaPublisher` (:mod:`kinbox.kafka`)
``batch``           send a batch keeping key order, judge each row
``topics``          topics Kafka refuses as a whole: an outage, not the rows'
``schedule``        the relay's upkeep as tasks: lane balancing, ``cleanup``
``telemetry``       the relay's ``send`` spans, counters and outbox gauges
``parked``          parked rows block their key until requeued
``outbox_status``   :func:`read_status`, for ``kinbox outbox status``
``links``           the outbox rows around one event, for ``kinbox explain``
``sent_retention``  sent rows outlive their records on the broker (cleanup's floor)
``debezium``        the outbox through Debezium instead (CDC); ``slots`` the
                    WAL its slot holds; ``connect_api``, ``connect_plugin``
``database``        a connection for the commands, the tables checked migrated
==================  ==========================================================

A library: it imports kinbox's core and its drivers (:mod:`kinbox.store`,
:mod:`kinbox.kafka`), never the consumer's engine nor the command line. The
``kinbox outbox`` commands are kinbox's (:mod:`kinbox.cli.outbox`), and the
relay runs as a kinbox process (:mod:`kinbox.ops.relay_process`). It ships
in the ``kinbox`` distribution (one version, one ``kinbox migrate``).
"""

from typing import TYPE_CHECKING

from kinbox.core.lazy import exports as _exports

if TYPE_CHECKING:
    from kinbox.core.errors import PayloadError
    from kinbox.core.publisher import Outcome, OutgoingRecord, Publisher
    from kinbox.kafka.publisher import KafkaPublisher
    from producer_outbox.cleanup import delete_sent
    from producer_outbox.config import RelayConfig
    from producer_outbox.outbox_status import OutboxStatus, read_status
    from producer_outbox.records import OutboxRow
    from producer_outbox.relay import Relay
    from producer_outbox.schema import OUTBOX
    from producer_outbox.writer import enqueue, enqueue_async

__all__ = [
    "OUTBOX",
    "KafkaPublisher",
    "OutboxRow",
    "OutboxStatus",
    "Outcome",
    "OutgoingRecord",
    "PayloadError",
    "Publisher",
    "Relay",
    "RelayConfig",
    "delete_sent",
    "enqueue",
    "enqueue_async",
    "read_status",
]

# Where each public name lives; __getattr__ imports it from there on first use.
_SOURCES = {
    "OUTBOX": "producer_outbox.schema",
    "KafkaPublisher": "kinbox.kafka.publisher",
    "OutgoingRecord": "kinbox.core.publisher",
    "OutboxRow": "producer_outbox.records",
    "OutboxStatus": "producer_outbox.outbox_status",
    "Outcome": "kinbox.core.publisher",
    "PayloadError": "kinbox.core.errors",
    "Publisher": "kinbox.core.publisher",
    "Relay": "producer_outbox.relay",
    "RelayConfig": "producer_outbox.config",
    "delete_sent": "producer_outbox.cleanup",
    "enqueue": "producer_outbox.writer",
    "enqueue_async": "producer_outbox.writer",
    "read_status": "producer_outbox.outbox_status",
}

__getattr__, __dir__ = _exports(__name__, _SOURCES)
