"""What a handler's parameters receive, read from its signature once, when it is registered.

=================  ============================================================
``signature``      which parameter gets the payload, the event, the connection
                   or a SQLAlchemy session: a :class:`~kinbox.params.signature.Parameters`
``payload``        decoding the record's value into the payload's type
``structs``        stdlib dataclasses built from decoded JSON (no pydantic)
``wrap``           the ``(event, tx)`` / ``(events, tx)`` function a handler kind calls
``validators``     payload types pydantic validates (the ``pydantic`` extra)
=================  ============================================================

Driver-free like the rest of the engine: registering a handler loads neither
pydantic nor SQLAlchemy unless its annotations already name them (then the
user's module has loaded them). pydantic's validators are in
:mod:`kinbox.params.validators`; a SQLAlchemy session and the Schema
Registry's deserializers need a driver (:mod:`kinbox.store.orm`,
:mod:`kinbox.kafka.serde`), which the prepared handler asks for as data
(:class:`~kinbox.params.wrap.Prepared`) and gets when the worker starts.
"""
