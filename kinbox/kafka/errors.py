"""confluent-kafka's errors, read correctly: fatal errors, refused configuration, translation.

Every ``KafkaException`` leaving kinbox's Kafka code passes through
:func:`translate`, which decides ``retriable``: false when the group has moved
on and a commit must be dropped, and a :class:`~kinbox.core.errors.FatalTransportError`
when the client instance is fatally broken.

**Fatal errors.** librdkafka raises a fatal error when a client instance can
never work again: a static group member fenced by another member with the
same ``group.instance.id``, an idempotent producer that can no longer keep
its ordering guarantee. confluent-kafka surfaces it in three shapes, and only
one of them says ``fatal()``:

- The error of a delivery report, of a consumed error event and of a call
  refused afterwards (``produce()``, ``commit()``) is built from the error
  code alone, so ``fatal()`` and ``retriable()`` are always false there; the
  code is ``_FATAL`` and, for a consumer, the text names the real reason.
- Where a call serves the client's error events itself (a producer's
  ``poll()``/``flush()``), the binding never passes ``_FATAL`` to an
  ``error_cb``: it asks librdkafka for the underlying error and raises it as
  a ``KafkaException`` whose error has ``fatal()`` true and the real code.
- If that call then runs a Python callback (a delivery report) with the
  exception pending, the call raises ``SystemError`` instead: with the
  fatal ``KafkaException`` as its ``__cause__``, or, as seen as well with
  confluent-kafka 2.16, "returned NULL without setting an exception" and no
  cause at all. Either way the binding lost track of its own state, so a
  ``SystemError`` from a client call counts as a fatally broken client too.
  Which of the two happens depends on the order librdkafka queued the
  error event and the delivery report in, so it varies from run to run. In
  the second case the reason is lost to Python but librdkafka has logged
  it (facility ``FATAL``): :class:`ClientLog` is the logger kinbox gives
  every client, and it remembers that line, so the reason is never lost.

:func:`is_fatal`, :func:`fatal_error` and :func:`broken` recognise all of
these; nothing else in kinbox or producer_outbox decides what is fatal.
Callbacks given to the binding only store what they are handed: with that
exception pending, any call on the error or the message would fail.

No client gets an ``error_cb``: the binding never hands it the fatal error,
and the underlying reason reaches kinbox without one — in the text of the
consumer's error event, and in the exception a producer's poll or flush
raises. (A commit refused by a fatal consumer carries only ``_FATAL``; the
runner then polls once more to read the event: see
:meth:`kinbox.consume.runner.Runner.run`.)

This module imports nothing of kinbox but the error tree, so
``producer_outbox`` uses it without loading the consumer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException

from kinbox.core.errors import ConfigurationError, FatalTransportError, TransportError

Client = TypeVar("Client")

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


def is_fatal(err: KafkaError | None) -> bool:
    """Whether ``err`` says that its client instance is fatally broken (see the module doc)."""
    return err is not None and (err.code() == KafkaError._FATAL or err.fatal())


def fatal_error(exc: BaseException | None) -> KafkaError | None:
    """The fatal error carried by ``exc`` or by an exception it was raised from, if any.

    Follows ``__cause__``/``__context__``, so the ``SystemError`` a poll or
    flush raises when a callback ran after the fatal error is recognised too.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, KafkaException) and exc.args:
            err = exc.args[0]
            if isinstance(err, KafkaError) and is_fatal(err):
                return err
        exc = exc.__cause__ or exc.__context__
    return None


def broken(exc: BaseException, log: ClientLog | None = None) -> str | None:
    """Why ``exc``, raised by a client call, means that client is unusable; ``None`` if not.

    A fatal error anywhere in its chain (its reason), or a ``SystemError``
    from the binding (see the module doc): then the reason librdkafka logged,
    if the client's ``log`` saw one.
    """
    err = fatal_error(exc)
    if err is not None:
        return describe(err)
    if isinstance(exc, SystemError):
        if log is not None and log.fatal is not None:
            return f"{log.fatal} (as librdkafka logged it; the binding raised {exc})"
        return f"the confluent-kafka binding failed after a client error: {exc}"
    return None


class ClientLog:
    """The logger a client writes to (``logger`` in its configuration), remembering its fatal error.

    confluent-kafka calls ``log(level, "%s [%s] %s", facility, client, text)``
    for each line librdkafka logs; this forwards it to ``logger`` and keeps
    the text of the last ``FATAL`` line, which :func:`broken` reports when
    the binding lost the error itself.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self.fatal: str | None = None
        """The last fatal error librdkafka logged for the client."""

    def log(self, level: int, msg: str, *args: object) -> None:
        """Forward one librdkafka log line; remember it if it is a fatal error."""
        if len(args) == 3 and args[0] == "FATAL":
            self.fatal = str(args[2])
        self._logger.log(level, msg, *args)


def describe(err: KafkaError) -> str:
    """``err`` as one line: its text and its code's name."""
    return f"{err.str()} ({err.name()})"


def translate(what: str, exc: KafkaException) -> TransportError:
    """Return the :class:`TransportError` for ``exc``, raised while doing ``what``."""
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if err is None:
        return TransportError(f"{what}: {exc}", retriable=False)
    if is_fatal(err):
        return FatalTransportError(f"{what}: {describe(err)}")
    return TransportError(f"{what}: {describe(err)}", retriable=err.code() not in REJECTED)


def create_client(
    factory: Callable[[dict[str, Any]], Client], config: Mapping[str, Any], what: str
) -> Client:
    """Create a confluent-kafka client with ``config``; a refusal is a configuration error.

    Creating a client only checks its configuration and starts its threads;
    connections are made in the background afterwards. So whatever it
    refuses — an unknown property, a bad value, a combination librdkafka
    rejects, a callback property given as text — is the configuration's
    fault (``-X`` overrides included), never the network's.

    Raises:
        ConfigurationError: naming the client and librdkafka's reason.
    """
    try:
        return factory(dict(config))
    except KafkaException as exc:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        reason = err.str() if err is not None else str(exc)
        raise ConfigurationError(f"invalid Kafka configuration for {what}: {reason}") from exc
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"invalid Kafka configuration for {what}: {exc}") from exc
