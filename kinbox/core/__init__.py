"""The ground floor: the vocabulary every layer of kinbox (and ``producer_outbox``) shares.

===============  ===============================================================
``errors``       the one error tree
``event``        :class:`~kinbox.core.event.Event`, what a handler receives
``config``       :class:`~kinbox.core.config.Settings`: flags > env > app > defaults
``names``        identifier and topic-name validation
``describe``     exceptions and values as safe, bounded text
``cause``        which inbox event a handler works for, read by ``enqueue``
``traceparent``  the W3C trace id of a record, stored by the claim
``reuse``        the payload digest the claim keeps, and a reused id's sighting
``failpoints``   crash points for the fault tests, one grammar
``lazy``         names that load on first use, for ``__init__`` files
``otel/``        OpenTelemetry names, W3C trace context, the SDK from ``OTEL_*``
``record``       :class:`~kinbox.core.record.Record`, a consumed Kafka record
``outcome``      what became of a partition batch: ``BatchResult``, ``Failure``, ``Step``
``letter``       a dead letter and its ``kinbox.dlq.*`` headers
``policy``       how long a failed partition waits before it is tried again
``lag``          the consumer's lag per partition, written by Kafka, read by telemetry
===============  ===============================================================

The seams, where the outside world enters (each a ``typing.Protocol``; the
drivers implement them, :mod:`kinbox.testing` fakes them):

===============  ===============================================================
``transport``    :class:`~kinbox.core.transport.Transport`: the group member's consumer
``publisher``    :class:`~kinbox.core.publisher.Publisher`: dead letters, replays
``inbox``        :class:`~kinbox.core.inbox.InboxStore` and its transactions, sync and async
===============  ===============================================================

Everything here imports only the standard library and the rest of
``kinbox.core`` (``policy`` also tenacity's wait); ``otel/`` alone imports
OpenTelemetry, and only its users load it. Importing this package loads none
of its modules.
"""
