"""Consume: the poll loop of one group member, up to the point a partition batch is applied.

=============  ================================================================
``runner``     the loop: poll, wait, commit offsets; the rebalance callbacks;
               the bounded stop
``flow``       a poll's records to their batch's result: queued, admitted,
               started, collected
``inflight``   the batch running on its worker thread while polling goes on
``offsets``    what may be committed to Kafka, and only that
``backoff``    a failed partition held paused, rewound and let go later
``breaker``    the circuit breaker: every partition held when the handler
               fails for event after event, then one event let through
``lanes``      records fetched but not yet in a batch, one lane per partition
``pauses``     who wants each partition paused; the only caller of pause and
               resume
=============  ================================================================

The top of the engine: it imports :mod:`kinbox.apply` and :mod:`kinbox.app`,
and no module here imports a Kafka or database driver: the runner talks to
:mod:`kinbox.core.transport` and :mod:`kinbox.core.inbox` only.
"""
