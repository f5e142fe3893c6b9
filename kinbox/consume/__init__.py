"""Consume: the poll loop of one group member, up to the point a partition batch is applied.

=============  ================================================================
``envelope``   :class:`Record` (a consumed record, driver-free) and its event
               id: record → :class:`~kinbox.core.event.Event`
``runner``     the loop: poll, split by partition, hand batches over, commit
               offsets; the rebalance callbacks
``inflight``   the batch running on its worker thread while polling goes on
``offsets``    what may be committed to Kafka, and only that
``backoff``    a failed partition paused, rewound and resumed later
``breaker``    the circuit breaker: every partition paused when the handler
               fails for event after event, then one event let through
=============  ================================================================

No module here imports a Kafka or database driver: the runner talks to
:mod:`kinbox.kafka.base` and :mod:`kinbox.store.base` only.
"""
