"""The ground floor: the vocabulary every layer of kinbox (and ``producer_outbox``) shares.

===============  ===============================================================
``errors``       the one error tree
``event``        :class:`~kinbox.core.event.Event`, what a handler receives
``config``       :class:`~kinbox.core.config.Settings`: flags > env > app > defaults
``names``        identifier and topic-name validation
``describe``     exceptions and values as safe, bounded text
``cause``        which inbox event a handler works for, read by ``enqueue``
``traceparent``  the W3C trace id of a record, stored by the claim
``failpoints``   crash points for the fault tests, one grammar
``lazy``         names that load on first use, for ``__init__`` files
``otel/``        OpenTelemetry names, W3C trace context, the SDK from ``OTEL_*``
===============  ===============================================================

Everything here imports only the standard library and the rest of
``kinbox.core``; ``otel/`` alone imports OpenTelemetry, and only its users
load it. Importing this package loads none of its modules.
"""
