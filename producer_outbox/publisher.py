"""The one module that touches confluent-kafka: publish a batch, report each record's fate.

:class:`Publisher` is the seam: the relay is unit-tested with a fake and
integration-tested with :class:`KafkaPublisher`, an idempotent producer
(``enable.idempotence=true``: no duplicates or reordering from the client's own
retries) that waits for the delivery report of every record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicCollection
from confluent_kafka.admin import (  # type: ignore[attr-defined]  # public, not re-exported in the stubs
    AclOperation,
    AdminClient,
)

from kinbox.errors import ConfigurationError
from kinbox.kafka.errors import ClientLog, broken, create_client, describe, is_fatal
from producer_outbox.records import Record

_Callback = Callable[[KafkaError | None, Message], None]
AdminFactory = Callable[[dict[str, Any]], AdminClient]

log = logging.getLogger(__name__)

#: librdkafka defaults the relay changes; ``-X`` overrides all but idempotence.
PRODUCER_DEFAULTS: dict[str, str] = {
    "enable.idempotence": "true",
    "acks": "all",
    # The relay flushes right after producing a batch (a flush sends at once,
    # whatever linger.ms says) and waits for every delivery report: lingering
    # only holds back the first request while the rest of the batch is being
    # produced. 1 ms lets the records produced meanwhile share it.
    "linger.ms": "1",
    # Every request is on the path to a batch's COMMIT; Nagle's algorithm
    # could hold a small one back until the previous one is acknowledged.
    "socket.nagle.disable": "true",
    # Every record gets a delivery report within this time, so a batch's
    # transaction is never held longer than this (plus a margin).
    "message.timeout.ms": "30000",
    # A missing topic is reported as UNKNOWN_TOPIC_OR_PART only after this
    # delay (librdkafka's default, 30 s, equals the message timeout above, so
    # the first try would end as a plain timeout); shorter, the relay learns
    # early that the topic, not the broker, is failing.
    "topic.metadata.propagation.max.ms": "10000",
}

# Errors that mean "Kafka is unreachable right now", not "this record is bad":
# they are recorded on the row but never park it.
_OUTAGE_CODES = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._PURGE_QUEUE,
        # Purged in flight: only ever by the relay itself, from a producer that went fatal.
        KafkaError._PURGE_INFLIGHT,
    }
)

# Errors that mean "this topic cannot be written at all" (missing with
# auto-create off, not authorized): an outage of the topic, never a failure of
# the row; the relay pauses the topic (see producer_outbox.topics).
_TOPIC_CODES = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    }
)


_MAY_WRITE = frozenset({AclOperation.WRITE, AclOperation.ALL})
# The admin client is a plain client: without these it asks for no producer id.
_PRODUCER_ONLY = ("enable.idempotence", "enable.gapless.guarantee", "acks", "message.timeout.ms")


@dataclass(frozen=True)
class Outcome:
    """The fate of one record: ``error is None`` means acknowledged by the broker.

    ``outage``: Kafka, not the record, failed (never counts as a try of the
    row). ``topic_failure``: the whole topic is refused (missing, not
    authorized). ``held``: not sent, because an earlier record of its key
    failed. Both of the latter are outages too.
    """

    error: str | None = None
    outage: bool = False
    topic_failure: bool = False
    held: bool = False

    @property
    def ok(self) -> bool:
        """Whether the broker acknowledged the record."""
        return self.error is None


ACKED = Outcome()
HELD = Outcome("not sent: an earlier record of its key failed", outage=True, held=True)


class Publisher(Protocol):
    """Publishes a batch and returns one :class:`Outcome` per record, in order."""

    def publish(self, records: Sequence[Record]) -> list[Outcome]:
        """Send ``records``; return only once every one has a final outcome."""
        ...

    def close(self) -> None:
        """Release the client."""
        ...


@runtime_checkable
class Siblings(Protocol):
    """A publisher that can make another like it, for a relay's second lane group."""

    def sibling(self) -> Publisher:
        """A new publisher with this one's settings and a client of its own."""
        ...


def producer_config(bootstrap_servers: str, overrides: Mapping[str, str]) -> dict[str, str]:
    """Build the producer configuration: relay defaults, then ``-X`` overrides.

    Raises:
        ConfigurationError: an override turns idempotence off.
    """
    if overrides.get("enable.idempotence", "true").lower() != "true":
        raise ConfigurationError(
            f"-X enable.idempotence={overrides['enable.idempotence']!r} is not allowed: "
            "the relay needs the idempotent producer to keep per-key order"
        )
    return {"bootstrap.servers": bootstrap_servers, **PRODUCER_DEFAULTS, **overrides}


def _outcome(error: KafkaError) -> Outcome:
    text = f"{error.name()}: {error.str()}"
    if error.code() in _TOPIC_CODES:
        return Outcome(error=text, outage=True, topic_failure=True)
    # A fatally broken producer says nothing about the record: never park it for that.
    outage = error.code() in _OUTAGE_CODES or error.retriable() or is_fatal(error)
    return Outcome(error=text, outage=outage)


class _Fatal:
    """Why the producer became unusable while publishing one batch, if it did."""

    reason: str | None = None

    def saw(self, error: KafkaError) -> None:
        self.because(describe(error))

    def because(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason


_PENDING = object()
"""No delivery report yet."""


_CASUALTIES = frozenset({KafkaError._FATAL, KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
"""Report codes of records that failed only because their producer went fatal."""


def _reported(report: object, missing: Outcome, fatal: bool) -> Outcome:
    """The outcome a delivery report says; ``missing`` when there was none to say more."""
    if report is _PENDING:
        return missing
    if report is None:
        return ACKED
    assert isinstance(report, KafkaError)
    if fatal and report.code() in _CASUALTIES:
        return missing  # it names the fatal error, which is the real reason
    return _outcome(report)


class KafkaPublisher:
    """A :class:`Publisher` over one idempotent ``confluent_kafka.Producer``.

    A fatal producer error (see :mod:`kinbox.kafka.errors`: idempotence
    state lost, or ``enable.gapless.guarantee`` unable to hold) makes every
    later call of that producer fail. The batch in hand then ends: each
    record the broker had not acknowledged gets an *outage* outcome (the
    relay retries it and never parks it for this), and the producer is
    replaced by a new one before the next batch. A record's own error (say,
    too large for the topic) keeps its own outcome.

    Args:
        config: the producer configuration (:func:`producer_config`).
        factory: creates the producer from ``config`` (a seam for tests).
        admin_factory: creates the admin client that asks whether a topic
            may be written (``None``: don't ask; a seam for tests).

    Raises:
        ConfigurationError: librdkafka refused the configuration (``-X``).
    """

    def __init__(
        self,
        config: Mapping[str, str],
        factory: Callable[[dict[str, str]], Producer] = Producer,
        admin_factory: AdminFactory | None = AdminClient,
    ) -> None:
        self._config = dict(config)
        self._factory = factory
        self._admin_factory = admin_factory
        self._admin: AdminClient | None = None  # made when first needed
        self._producer = self._create()
        timeout_ms = int(self._config.get("message.timeout.ms", "300000"))
        self._flush_timeout = timeout_ms / 1000 + 5.0
        self.replaced = 0
        """How many times a fatally failed producer was replaced."""
        self._metadata_timeout = min(10.0, timeout_ms / 1000)
        self._writable: set[str] = set()  # topics the broker confirmed (see _refused_topics)

    def sibling(self) -> KafkaPublisher:
        """A new publisher with this one's configuration and a producer of its own.

        A relay's lane groups each publish through their own producer, so one
        group's flush never waits for another's records (see
        :mod:`producer_outbox.group`).
        """
        return KafkaPublisher(self._config, self._factory)

    def publish(self, records: Sequence[Record]) -> list[Outcome]:
        """Produce every record, flush, and return each delivery report's outcome."""
        # Set at once: refused by produce(), or held back behind its key.
        outcomes: list[Outcome | None] = [None] * len(records)
        reports: list[object] = [_PENDING] * len(records)
        fatal = _Fatal()

        def report(index: int) -> _Callback:
            def on_delivery(error: KafkaError | None, _message: Message) -> None:
                # Only store it: after a fatal error the binding may run this
                # with that exception pending, when any call on `error` fails.
                reports[index] = error

            return on_delivery

        # A key's order spans topics (the outbox orders rows by key, whatever their topic).
        failed_keys: set[bytes] = set()
        refused_topics = self._refused_topics(records)
        for index, record in enumerate(records):
            if fatal.reason is not None:
                break  # the producer can send nothing more; the rest is not delivered
            if record.key is not None and record.key in failed_keys:
                # An earlier record of this key was refused at once (e.g. too large):
                # sending this one would overtake it. It waits, untouched (HELD).
                outcomes[index] = HELD
                continue
            if record.topic in refused_topics:
                outcomes[index] = refused_topics[record.topic]
            else:
                self._produce(index, record, report(index), outcomes, fatal)
            refused = outcomes[index]  # set already only when produce() refused it
            if record.key is not None and refused is not None and not refused.ok:
                failed_keys.add(record.key)

        def waiting() -> bool:
            return any(o is None and r is _PENDING for o, r in zip(outcomes, reports, strict=True))

        deadline = time.monotonic() + self._flush_timeout
        while fatal.reason is None and waiting() and time.monotonic() < deadline:
            self._serve(fatal, lambda: self._producer.flush(min(1.0, deadline - time.monotonic())))
        if fatal.reason is None and any(isinstance(r, KafkaError) for r in reports):
            # A refusal can make the producer fatal (enable.gapless.guarantee):
            # serve its error event now, not in the next batch's produce().
            self._serve(fatal, lambda: self._producer.poll(0))
        for error in reports:
            if isinstance(error, KafkaError) and is_fatal(error):
                fatal.saw(error)  # a report that carries only the code _FATAL
        if fatal.reason is not None:
            self._replace(fatal.reason, waiting)
        elif waiting():
            # Should not happen (message.timeout.ms bounds every record); drop what
            # is still queued so it cannot go out after a retry of the same row.
            self._producer.purge(in_queue=True, in_flight=False)
            self._serve(fatal, lambda: self._producer.poll(0))
        missing = (
            Outcome(f"not delivered: the producer failed fatally ({fatal.reason})", outage=True)
            if fatal.reason is not None
            else Outcome("no delivery report in time", outage=True)
        )
        final = [
            outcome
            if outcome is not None
            else _reported(reports[index], missing, fatal.reason is not None)
            for index, outcome in enumerate(outcomes)
        ]
        # A topic refused now is asked about again before its next records go.
        self._writable -= {r.topic for r, o in zip(records, final, strict=True) if o.topic_failure}
        return final

    def _refused_topics(self, records: Sequence[Record]) -> dict[str, Outcome]:
        """Ask the broker about topics not yet confirmed; return those it refuses as a whole.

        librdkafka reports a missing topic only in the delivery report, after
        ``topic.metadata.propagation.max.ms``, by which time later records of
        the same keys in other topics may be acknowledged. Asked first, a
        missing or forbidden topic fails its records before any is produced,
        so the later records of their keys are held. So does one this client
        may see but not write (:meth:`_write_denied`).
        """
        refused: dict[str, Outcome] = {}
        for topic in sorted({r.topic for r in records} - self._writable):
            try:
                metadata = self._producer.list_topics(topic, timeout=self._metadata_timeout)
            except KafkaException:
                continue  # broker unreachable: producing reports the outage
            found = metadata.topics.get(topic)
            error = found.error if found is not None else None
            if found is not None and error is None:
                denied = self._write_denied(topic)
                if denied is None:
                    self._writable.add(topic)
                else:
                    refused[topic] = denied
            elif error is not None and error.code() in _TOPIC_CODES:
                refused[topic] = _outcome(error)
        return refused

    def _write_denied(self, topic: str) -> Outcome | None:
        """The outcome of ``topic``'s records if the broker says they may not be written.

        A topic the client may DESCRIBE but not WRITE looks fine in the
        metadata; the refusal comes only in the delivery report. The broker
        says which operations are allowed (KIP-430), so ask it. No answer
        (no authorizer, an old broker, a timeout) means go ahead: producing
        reports a refusal anyway.
        """
        if self._admin_factory is None:
            return None
        if self._admin is None:
            config = {k: v for k, v in self._config.items() if k not in _PRODUCER_ONLY}
            self._admin = create_client(self._admin_factory, config, "the outbox relay's admin")
        try:
            futures = self._admin.describe_topics(
                TopicCollection([topic]), include_authorized_operations=True
            )
            allowed = futures[topic].result(timeout=self._metadata_timeout).authorized_operations
        except (KafkaException, TimeoutError):
            return None
        if allowed is None or _MAY_WRITE.intersection(allowed):
            return None
        reason = f"not authorized to write to topic {topic!r} (the broker's ACLs)"
        return _outcome(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, reason))

    def _produce(
        self,
        index: int,
        record: Record,
        callback: _Callback,
        outcomes: list[Outcome | None],
        fatal: _Fatal,
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    record.topic,
                    value=record.value,
                    key=record.key,
                    # The record's own list (made for this send, never kept):
                    # no copy. Invariance alone makes the stubs refuse it.
                    headers=record.headers,  # type: ignore[arg-type]
                    on_delivery=callback,
                )
                return
            except BufferError:
                # Local queue full: let reports drain.
                if not self._serve(fatal, lambda: self._producer.poll(0.1)):
                    return
            except KafkaException as exc:
                error = exc.args[0]
                if is_fatal(error):
                    fatal.saw(error)
                outcomes[index] = _outcome(error)
                return

    def _serve(self, fatal: _Fatal, call: Callable[[], int]) -> bool:
        """Run a ``poll``/``flush``; False if it met the producer's fatal error."""
        try:
            call()
        except (KafkaException, SystemError) as exc:
            # SystemError: a delivery report ran with the fatal error pending.
            reason = broken(exc, self._log)
            if reason is None:
                raise
            fatal.because(reason)
            return False
        return True

    def _create(self) -> Producer:
        # A log per producer: the fatal reason it remembers is this one's.
        self._log = ClientLog(logging.getLogger("producer_outbox.kafka"))
        config: dict[str, Any] = {**self._config, "logger": self._log}
        return create_client(self._factory, config, "the outbox relay's producer")

    def _replace(self, reason: str, waiting: Callable[[], bool]) -> None:
        """Collect what the failed producer still has to report, then use a new one."""
        log.error(
            "fatal Kafka producer error (%s); records not acknowledged are retried, never "
            "parked for it; creating a new producer",
            reason,
        )
        old, self._producer = self._producer, self._create()
        self.replaced += 1
        try:
            # Nothing of the old one may still go out behind the rows' retry.
            old.purge(in_queue=True, in_flight=True, blocking=False)
        except (KafkaException, SystemError) as exc:
            log.debug("purging the failed producer: %s", exc)
        # The fatal error stopped the poll that raised it: the reports it had
        # not served yet (a record's own refusal, the purged ones) come now.
        deadline = time.monotonic() + 1.0
        while waiting() and time.monotonic() < deadline:
            try:
                old.poll(0.1)
            except (KafkaException, SystemError) as exc:  # it is broken: best effort
                log.debug("draining the failed producer: %s", exc)

    def close(self) -> None:
        """Flush what is left and drop the producer."""
        try:
            self._producer.flush(self._flush_timeout)
        except (KafkaException, SystemError) as exc:
            log.warning("closing the outbox relay's producer: %s", exc)
