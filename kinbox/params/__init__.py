"""What a handler's parameters receive, read from its signature once, when it is registered.

=================  ============================================================
``signature``      which parameter gets the payload, the event, the connection
                   or a SQLAlchemy session: a :class:`~kinbox.params.signature.Plan`
``payload``        decoding the record's value into the payload's type
``structs``        stdlib dataclasses built from decoded JSON (no pydantic)
``wrap``           the ``(event, tx)`` / ``(events, tx)`` function a handler kind calls
=================  ============================================================

Driver-free like the rest of the core: registering a handler loads neither
pydantic nor SQLAlchemy unless its annotations already name them (then the
user's module has loaded them). pydantic's validators are in
:mod:`kinbox.params.validators`, the SQLAlchemy session lives with the store
(:mod:`kinbox.store.orm`), the Schema Registry's deserializers with Kafka
(:mod:`kinbox.kafka.serde`); both are imported only for a handler that uses them.
"""
