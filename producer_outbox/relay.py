"""The relay: publish committed outbox rows to Kafka, at least once, in per-key order.

``parallel`` lane groups (2 by default), one thread each, every group the
relay's loop over its share of the lanes with its own connection and producer
(:mod:`.group`)::

    wake (NOTIFY from a committing writer, or the poll interval as fallback)
    ──► claim (read-only, no lock) ──► send ──► as delivery reports come, mark
        each settled key's rows (a short write transaction) and free the key
    ──► upkeep tasks that are due: lane balancing; in group 0 the cleanup
        (never of rows whose topic still keeps their records, :mod:`.retention`)
        and, with an SDK, the outbox's gauges

With two groups, one group's PostgreSQL work overlaps the other's Python and
Kafka work; they never have rows of the same key in flight (:mod:`.group`
says why). No transaction of the relay stays open while Kafka works: nothing
the relay does holds back the ``pg_snapshot_xmin`` its claims filter on.

Guarantees and choices:

- **At least once.** A row is marked sent only after Kafka acknowledged it. A
  crash between the ack and the mark's COMMIT publishes the rows that were
  acknowledged and not yet marked again: at most one batch per lane group (a
  group has no more in flight), unless a topic had stopped answering for
  seconds and its rows were acknowledged meanwhile (:mod:`.group`). A relay
  whose connection dies loses its lanes while rows may be in flight; whoever
  takes a lane then publishes those rows again. The inbox drops the
  duplicates by event id.
- **Per-key order.** A key is the ``key`` given to ``enqueue``
  (``aggregateid``), across topics. A key's rows are published in
  ``(txid, seq)`` order, the order :mod:`.claim` defines: the rows of one
  transaction in the order it enqueued them, never interleaved with another
  transaction's; the rows of different transactions in the order PostgreSQL
  gave those transactions their ids — at their first write (INSERT, UPDATE,
  DELETE, SELECT … FOR UPDATE/SHARE) or ``pg_current_xact_id()`` call, not at
  BEGIN and not at COMMIT. A row goes out only once every transaction with a
  lower id has ended, so the order is final when the row is published, every
  relay agrees on it, and writers need not lock anything. It holds with any
  number of relays: one lane per key, one relay per lane (:mod:`.lanes`),
  and a key with rows in flight is left out of the next claims until they
  are marked (:mod:`.flight`).
  It is *commit* order when the writers of a key serialise on a lock taken
  before their first write: ``SELECT … FOR UPDATE`` of the aggregate's row (a
  transaction waiting for a row lock gets its id only once it holds it) or
  ``pg_advisory_xact_lock`` (which assigns no id) as the first statement. An
  ``UPDATE`` as the first statement is not enough: PostgreSQL gives the
  updating transaction its id *before* it waits for the row lock, so two such
  writers starting at the same moment can be published in the opposite order
  of their commits.
- **Failure** (verdicts in :mod:`.batch`). A row whose publish fails by its
  own fault gets ``attempts + 1``, ``last_error`` and an exponential backoff,
  and is parked (``status = 'dead'``) on its ``max_attempts``-th such failure.
  Later rows of its key wait for it, also while it is parked: a parked row
  blocks its key until ``kinbox outbox requeue`` puts it back, and it then
  goes out first (:mod:`.parked`). Rows of other keys never wait, neither for
  a parked row nor for a record that a broker keeps waiting (a topic whose
  leader is down holds back only the keys of its rows in flight). Outages
  (broker unreachable, timeouts) and a topic Kafka refuses as a whole
  (missing, not authorized: :mod:`.topics`) never count as attempts and never
  park; a row that only waited behind another is left untouched.
  Limitation: when Kafka refuses a record only in its delivery report while a
  later record of its key, sent in another produce request, is acknowledged,
  the later one cannot be taken back; the relay logs the order break at
  ERROR. The client refuses a record over its own ``message.max.bytes`` at
  once, before sending it, and then the later rows of its key are held: with
  ``-X message.max.bytes`` no higher than the topics' ``max.message.bytes``,
  an oversized row cannot break order.
- **Latency.** Writers ``NOTIFY`` in their transaction; the relay ``LISTEN``s
  and wakes within milliseconds of the commit. ``poll_interval`` is the
  fallback (lost notification, backoff expiry, rows held by the xmin filter).
- **Upkeep** runs between a group's steps on its connection (a lane is
  released only when none of its rows is in flight). A
  failing task is logged and tried again one interval later; only a lost
  connection ends the group's connected loop, which reconnects. Lane
  balancing starts anew with each connection (the locks were the old
  connection's); the cleanup keeps its schedule across reconnects, its first
  run right after the start.
- **Health.** An optional observer (:class:`RelayObserver`; ``--health-port``
  serves it as ``/livez`` and ``/readyz``) hears how many lanes the relay
  owns (all groups together) and that the loop turns: a turn is reported
  once every group turned since the last report, so one stuck group makes
  the whole relay not live.
- **Shutdown.** :meth:`Relay.stop` (SIGTERM/SIGINT in the CLI) lets each
  group's rows in flight get their delivery reports (each within
  ``message.timeout.ms``) and marks, releases the lanes, closes
  connections. A group that fails stops the others, and :meth:`Relay.run`
  raises its error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import psycopg

from kinbox.core.publisher import Publisher, Siblings
from producer_outbox.config import RelayConfig
from producer_outbox.group import Connection, LaneGroup
from producer_outbox.sent_retention import TopicRetention
from producer_outbox.shared import RelayObserver, Shared
from producer_outbox.telemetry import RelayTelemetry

__all__ = ["Relay", "RelayConfig", "RelayObserver"]

log = logging.getLogger(__name__)


class Relay:
    """Publishes one schema's outbox; :meth:`run` until :meth:`stop`.

    ``publisher`` publishes for the first lane group; the others get a
    sibling each (:class:`~kinbox.core.publisher.Siblings`), closed when
    :meth:`run` returns (as is each group's second producer, for the rows
    that go alone). A publisher without siblings (a test's fake) runs one
    group.
    """

    def __init__(
        self,
        config: RelayConfig,
        publisher: Publisher,
        *,
        connect: Callable[[], Connection] | None = None,
        observer: RelayObserver | None = None,
        topic_retention: TopicRetention | None = None,
        telemetry: RelayTelemetry | None = None,
    ) -> None:
        self.config = config.validate()
        # With it, sent rows outlive their records on the broker (:mod:`.retention`).
        self._topic_retention = topic_retention
        self._observer = observer
        self._publisher = publisher
        # One for every group: its instruments are thread-safe, its gauges read by group 0.
        self._telemetry = telemetry or RelayTelemetry(self.config.schema)
        self._connect = connect or (lambda: psycopg.connect(config.database_url, autocommit=True))
        self._stopping = False
        groups = min(self.config.parallel, self.config.lanes)
        self.groups = groups if isinstance(publisher, Siblings) else 1
        """How many lane groups :meth:`run` runs side by side."""

    def stop(self) -> None:
        """Ask :meth:`run` to return once the rows in flight are settled (signal-handler safe)."""
        self._stopping = True

    def run(self) -> None:
        """Publish until :meth:`stop`; reconnect with backoff when PostgreSQL fails.

        Raises:
            Exception: what ended a lane group other than a lost connection
                (after the other groups stopped).
        """
        publishers = [self._publisher]
        if isinstance(self._publisher, Siblings):
            publishers += [self._publisher.sibling() for _ in range(self.groups - 1)]
        shared = Shared(self.groups, self._observer)
        errors: list[BaseException] = []
        groups = [
            LaneGroup(
                self.config,
                publishers[index],
                self._connect,
                index=index,
                groups=self.groups,
                should_stop=lambda: self._stopping or bool(errors),
                shared=shared,
                telemetry=self._telemetry,
                topic_retention=self._topic_retention,
            )
            for index in range(self.groups)
        ]

        def run_group(group: LaneGroup) -> None:
            try:
                group.run()
            except BaseException as exc:  # re-raised by run() once every group stopped
                errors.append(exc)

        threads = [
            threading.Thread(target=run_group, args=(group,), name=f"outbox-lanes-{group.index}")
            for group in groups[1:]
        ]
        try:
            for thread in threads:
                thread.start()
            # Group 0 runs here: the caller's thread, which receives the signals.
            run_group(groups[0])
        finally:
            for thread in threads:
                thread.join()
            for sibling in publishers[1:]:
                sibling.close()
        if errors:
            raise errors[0]
