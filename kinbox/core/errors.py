"""The one error tree of kinbox and producer_outbox.

::

    KinboxError
    ├── ConfigurationError(KinboxError, ValueError)   bad settings, duplicate handler
    ├── EnvelopeError                                  bad/missing event id, undecodable payload
    ├── PayloadError(KinboxError, TypeError)           outbox payload/header not serialisable
    ├── StoreError                                     from psycopg errors; .transient
    │   ├── SchemaError                                kinbox tables missing or too old
    │   └── ConflictError                              the server aborted the transaction over a
    │                                                  conflict (serialization failure, deadlock)
    ├── TransportError                                 from KafkaException; .retriable
    │   └── FatalTransportError                        the Kafka client is unusable for good
    ├── ServiceError                                   a local dev service failed to start
    ├── ConnectorError                                 Kafka Connect refused or failed a connector
    ├── FailpointError                                 a crash test's ``raise`` failpoint fired
    │                                                  (in kinbox.core.failpoints: crash tests only)
    ├── TransactionControlError                        a handler tried to end the inbox
    │                                                  transaction (commit or roll back) itself
    ├── HandlerCancelled                               an async handler's coroutine was
    │                                                  cancelled: a failed try of its event
    ├── HandlerAborted                                 a handler raised a BaseException that
    │                                                  asks no exit: a failed try of its event
    ├── RedeliveryUnsafe(KinboxError, AssertionError)  a handler's effect changed on redelivery
    │                                                  (in kinbox.testing: users' tests only)
    └── (control flow, never logged as errors)
        ├── Retry(delay)                               a handler asks to be tried again later
        └── DeadLetter(reason)                         a handler gives the event up
            └── InvalidPayload                         the payload does not decode into the
                                                       handler's type: reason ``payload``

Outside that tree, because no ``except Exception`` may take them for an
event's failure::

    WorkerExit(BaseException)                          the worker must stop (its own exit status)
    ├── ExitRequested                                  code kinbox runs raised SystemExit or
    │                                                  KeyboardInterrupt on a worker thread
    └── ThreadDied                                     a thread the worker needs died (the event
                                                       loop of async handlers)

Library exceptions are translated at the seam where they enter
(:mod:`kinbox.store.postgres` for psycopg, :mod:`kinbox.kafka` for confluent-kafka) to
the most specific class here, with ``raise ... from exc`` so the cause stays
visible. This module imports nothing of kinbox, so ``producer_outbox`` can use
it without loading the consumer.
"""

from __future__ import annotations


class KinboxError(Exception):
    """Base class of every error kinbox raises on purpose."""


class ConfigurationError(KinboxError, ValueError):
    """A setting, a name or a registration is invalid.

    Raised at start-up (or at import, for handler registration), never while
    events are flowing. The message names the setting, the value and what is
    allowed.
    """


class EnvelopeError(KinboxError):
    """A Kafka record cannot be turned into an event.

    The event id is missing or malformed, or the payload cannot be decoded.
    ``topic``/``partition``/``offset`` locate the record.
    """

    def __init__(
        self,
        message: str,
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset


class PayloadError(KinboxError, TypeError):
    """The payload (or a header) cannot be serialised for the outbox."""


class StoreError(KinboxError):
    """PostgreSQL failed.

    ``transient`` is true when trying again may succeed (connection lost,
    server restart, deadlock, serialization failure).
    """

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


class SchemaError(StoreError):
    """The kinbox tables are missing or older than this version needs."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


class ConflictError(StoreError):
    """PostgreSQL aborted the transaction to resolve a conflict with another one.

    A serialization failure (``40001``) or a deadlock (``40P01``): trying
    again may succeed, so it is ``transient``, but an event's conflicts are
    retried a bounded number of times in a row before one counts as its try
    (see :mod:`kinbox.apply.narrow`).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=True)


class TransportError(KinboxError):
    """Kafka failed; ``retriable`` says whether the client may try again."""

    def __init__(self, message: str, *, retriable: bool) -> None:
        super().__init__(message)
        self.retriable = retriable


class FatalTransportError(TransportError):
    """A Kafka client hit a librdkafka *fatal* error: that client instance is unusable.

    Nothing done with it will succeed again (a static member fenced by another
    with the same ``group.instance.id``, an idempotent producer that lost its
    sequence state...). A producer is replaced; a consumer ends the worker
    with its own exit code. Never retriable.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, retriable=False)


class ServiceError(KinboxError):
    """A local service (Kafka broker, PostgreSQL server) could not be started or reached."""


class ConnectorError(KinboxError):
    """Kafka Connect refused a connector configuration, or the connector or its task failed.

    The message carries Connect's own error (the first lines of a task's trace).
    """


class TransactionControlError(KinboxError):
    """A handler tried to commit or roll back the inbox transaction itself.

    kinbox commits the handler's work together with the event's claim, or
    rolls both back; a handler that ends the transaction would break that.
    Raised, for example, by ``session.connection().commit()`` on the
    SQLAlchemy session kinbox hands out (``session.commit()`` itself is
    harmless there: it only ends the session's own savepoint).
    """


class HandlerCancelled(KinboxError):
    """An async handler's coroutine ended cancelled (``asyncio.CancelledError``).

    Translated so that it is a failure of the event, tried again and in the
    end dead-lettered like any exception of a handler, never a
    ``BaseException`` that would end the worker on every redelivery.
    """


class HandlerAborted(KinboxError):
    """A handler raised a ``BaseException`` that is no request to exit.

    ``GeneratorExit``, or a library's own subclass of ``BaseException``: the
    handler did not apply its event, so it is a failure of the event, tried
    again and in the end dead-lettered like any exception. Raised in its
    place (the original is its ``__cause__``) so that it neither ends the
    worker on every redelivery nor escapes the failure policy. ``SystemExit``
    and ``KeyboardInterrupt`` are :class:`ExitRequested` instead.
    """


class WorkerExit(BaseException):
    """The worker must stop: never an event's failure, whatever ``except Exception`` it crosses.

    Raised on a batch thread, it rolls the batch's transaction back and ends
    the batch; the worker then stops as for any batch that raised (within
    ``shutdown_timeout``, committing what is safe) and ``kinbox worker``
    exits with the subclass's status (see ``kinbox.ops.exits``).
    """


class ExitRequested(WorkerExit):
    """Code the worker runs raised ``SystemExit`` or ``KeyboardInterrupt`` on a worker thread.

    A handler (or a middleware hook) that calls ``sys.exit()`` asks the
    process to stop. On a batch thread that would end the thread silently,
    or come back to the main thread as the process's exit status, so kinbox
    stops the worker itself, safely, and ``kinbox worker`` exits with its
    own status (9). The original exception is the ``__cause__``.
    """


class ThreadDied(WorkerExit):
    """A thread the worker needs died: the event loop of async handlers, the client watch.

    Raised to every call that waits on it, so none waits forever, and by
    ``kinbox worker`` when it sees such a thread end; the worker then stops
    and exits with its own status (10). The thread's exception is the ``__cause__``.
    """


class Retry(KinboxError):
    """Raised by a handler to ask for the event to be tried again after ``delay`` seconds."""

    def __init__(self, delay: float = 1.0, reason: str = "") -> None:
        super().__init__(reason or f"retry requested in {delay}s")
        self.delay = delay
        self.reason = reason


class DeadLetter(KinboxError):
    """Raised by a handler to give the event up: it goes to the dead-letter topic."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InvalidPayload(DeadLetter):
    """The payload cannot be decoded or validated into the type the handler asked for.

    A permanent failure: trying again cannot change the bytes, so the event is
    dead-lettered at once with reason ``payload``, its handler never called.
    kinbox raises it when decoding; a handler (or a ``value_deserializer``)
    may raise it too. The message says which type and why, with the
    validation error's own text.
    """
