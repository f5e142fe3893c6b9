"""Translation of confluent-kafka's exceptions into :class:`~kinbox.errors.TransportError`.

Every ``KafkaException`` leaving :mod:`kinbox.kafka` passes through
:func:`translate`, which decides ``retriable``: false when the client says the
error is fatal, or when the group has moved on and a commit must be dropped.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from kinbox.errors import TransportError

# The group has moved on: this member's generation/epoch is stale, so the
# commit must be dropped, never retried (the partition may have a new owner).
REJECTED = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.STALE_MEMBER_EPOCH,
        KafkaError.FENCED_MEMBER_EPOCH,
        KafkaError._ASSIGNMENT_LOST,
        KafkaError._STATE,
    }
)


def translate(what: str, exc: KafkaException) -> TransportError:
    """Return the :class:`TransportError` for ``exc``, raised while doing ``what``."""
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if err is None:
        return TransportError(f"{what}: {exc}", retriable=False)
    retriable = err.code() not in REJECTED and not err.fatal()
    return TransportError(f"{what}: {err.str()} ({err.name()})", retriable=retriable)
