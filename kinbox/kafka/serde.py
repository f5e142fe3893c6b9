"""confluent-kafka deserializers as payload readers: Schema Registry's Avro, Protobuf, JSON Schema.

``@handler("t", value_deserializer=AvroDeserializer(registry))`` (or the App's
``value_deserializer=``) decodes each value the way a confluent-kafka consumer
would, with the topic, the value field and the record's headers as its
``SerializationContext`` (so a schema id carried in a header works too); the
result is then converted to the handler's payload type
(:mod:`kinbox.params.payload`). ``pip install 'kinbox[schema-registry]'``.

What a failure means:

- the record is not the deserializer's (bad magic byte, a schema id the
  registry does not know, bytes that do not match the schema): the payload is
  bad for good, dead-lettered with reason ``payload``;
- the registry cannot be reached or answers with a server error (5xx, 408,
  429), or the connection fails: nothing is wrong with the record, so it is
  :class:`~kinbox.core.errors.Retry` — tried again after a pause (it counts as a
  try; schemas are cached by id, so only records with a schema this worker has
  not fetched yet need the registry).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import cast

from confluent_kafka.serialization import Deserializer, MessageField, SerializationContext

from kinbox.core.describe import describe
from kinbox.core.errors import Retry
from kinbox.core.event import Event

_UNAVAILABLE_STATUS = frozenset({408, 429})
REGISTRY_RETRY_DELAY = 1.0
"""Seconds before an event whose schema could not be fetched is tried again."""


def reader(deserializer: object) -> Callable[[Event], object]:
    """Event -> what ``deserializer`` makes of its value (``None`` for an empty value).

    The :data:`~kinbox.core.transport.ValueReader` the worker hands its batch
    code; ``deserializer`` is a confluent-kafka ``Deserializer``.

    Raises (from the returned function):
        Retry: the schema registry could not be reached.
        Exception: whatever the deserializer raised about the record itself.
    """
    call = cast(Deserializer, deserializer)

    def read(event: Event) -> object:
        context = SerializationContext(event.topic, MessageField.VALUE, list(event.headers))
        try:
            # An empty value is a tombstone; confluent's deserializers take it as None.
            return call(event.value or None, context)
        except Exception as exc:
            if unavailable(exc):
                raise Retry(REGISTRY_RETRY_DELAY, f"schema registry: {describe(exc)}") from exc
            raise

    return read


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the registry, not the record, failed."""
    errors = sys.modules.get("confluent_kafka.schema_registry.error")
    registry_error = getattr(errors, "SchemaRegistryError", None)
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(registry_error, type) and isinstance(current, registry_error):
            status = getattr(current, "http_status_code", 0)
            return status >= 500 or status in _UNAVAILABLE_STATUS
        if isinstance(current, OSError | TimeoutError) or _transport_error(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _transport_error(exc: BaseException) -> bool:
    """An httpx (or httpx2) network failure: DNS, refused, reset, timed out."""
    return any(
        cls.__name__ == "TransportError" and cls.__module__.split(".")[0] in {"httpx", "httpx2"}
        for cls in type(exc).__mro__
    )
