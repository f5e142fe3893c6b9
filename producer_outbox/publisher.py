"""The one module that touches confluent-kafka: send records, report each record's fate.

:class:`Publisher` is the seam: the relay is unit-tested with a fake and
integration-tested with :class:`KafkaPublisher`, an idempotent producer
(``enable.idempotence=true``: no duplicates or reordering from the client's own
retries) that reports the delivery of every record.

The relay never waits for a whole batch: it sends records (:meth:`~Streaming.send`)
and gets a :class:`Sending` back at once, whose outcomes fill in as
:meth:`~Streaming.serve` hands over the delivery reports. So a record that waits
on a broker that does not answer holds up nothing but itself (and the rows of
its key, which the lane group keeps back: :mod:`.flight`). A publisher with
only :meth:`Publisher.publish` (a test's fake) is used through
:func:`streaming`, which sends synchronously.
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

from kinbox.core.errors import ConfigurationError
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


TOPIC_CHECK_WAIT = 2.0
"""Seconds a send waits for the cluster's answer about a topic it has not confirmed yet.

The whole lane group waits meanwhile, so not long: the broker asked may be
frozen. Without an answer the records go (as they would to a confirmed topic),
and the topic is not asked about again until a delivery report refuses it.
"""

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


class Sending:
    """The records of one :meth:`Streaming.send`, and their outcomes as Kafka reports them.

    ``outcomes[i]`` is ``None`` until record ``i`` has its final outcome. Each
    index whose outcome became known is appended to :attr:`known` once, in the
    order they came; the reader takes them from there.
    """

    def __init__(self, count: int) -> None:
        self.outcomes: list[Outcome | None] = [None] * count
        self.known: list[int] = []
        """Indexes whose outcome came since the reader last cleared this list."""
        self._unknown = count

    @classmethod
    def of(cls, outcomes: Sequence[Outcome]) -> Sending:
        """A sending whose every outcome is known already."""
        sending = cls(len(outcomes))
        for index, outcome in enumerate(outcomes):
            sending.settle(index, outcome)
        return sending

    @property
    def done(self) -> bool:
        """Whether every record has its final outcome."""
        return self._unknown == 0

    def settle(self, index: int, outcome: Outcome) -> None:
        """Give record ``index`` its final ``outcome`` (a second one is ignored)."""
        if self.outcomes[index] is None:
            self.outcomes[index] = outcome
            self.known.append(index)
            self._unknown -= 1


@runtime_checkable
class Streaming(Protocol):
    """A publisher that sends without waiting: outcomes come later, through :meth:`serve`."""

    def send(self, records: Sequence[Record]) -> Sending:
        """Start sending ``records`` (in order); return at once.

        Records refused before they leave (the topic refused as a whole, a
        record over the client's size limit, one held behind a refused record
        of its key) have their outcome in the returned :class:`Sending` already.
        """
        ...

    def serve(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for delivery reports; fill in the sendings' outcomes.

        Returns at once when nothing is in flight. A record gets an outcome in
        bounded time: its report, or an outage outcome when none came.
        """
        ...

    def close(self) -> None:
        """Release the client."""
        ...


class _Synchronous:
    """A :class:`Publisher` that only publishes and waits, used as a :class:`Streaming` one."""

    def __init__(self, publisher: Publisher) -> None:
        self._publisher = publisher

    def send(self, records: Sequence[Record]) -> Sending:
        return Sending.of(self._publisher.publish(records))

    def serve(self, timeout: float) -> None:
        """Nothing is ever left in flight."""

    def close(self) -> None:
        self._publisher.close()


AnyPublisher = Publisher | Streaming
"""What a relay publishes through: a :class:`Streaming` publisher, or one it adapts."""


def streaming(publisher: AnyPublisher) -> Streaming:
    """``publisher`` itself if it can stream, else one that sends it each batch and waits."""
    return publisher if isinstance(publisher, Streaming) else _Synchronous(publisher)


@runtime_checkable
class Siblings(Protocol):
    """A publisher that can make another like it, for a relay's second lane group."""

    def sibling(self) -> AnyPublisher:
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


_LATE = Outcome("no delivery report in time", outage=True)


class _Flight:
    """The records of one send that still wait for delivery reports, and their sending."""

    def __init__(self, records: Sequence[Record], deadline: float) -> None:
        self.records = records
        self.sending = Sending(len(records))
        self.deadline = deadline
        """When every report should have come (``message.timeout.ms`` and a margin)."""
        self.reports: list[object] = [_PENDING] * len(records)
        self.arrived: list[int] = []
        """Indexes whose report came and is not yet an outcome."""

    def report(self, index: int) -> _Callback:
        """The delivery callback of record ``index``."""

        def on_delivery(error: KafkaError | None, _message: Message) -> None:
            # Only store it: after a fatal error the binding may run this
            # with that exception pending, when any call on `error` fails.
            self.reports[index] = error
            self.arrived.append(index)

        return on_delivery

    def waiting(self) -> bool:
        """Whether a record has neither an outcome nor a report."""
        return any(
            outcome is None and report is _PENDING
            for outcome, report in zip(self.sending.outcomes, self.reports, strict=True)
        )


class KafkaPublisher:
    """A :class:`Publisher`, :class:`Streaming` too, over an idempotent confluent-kafka producer.

    A fatal producer error (see :mod:`kinbox.kafka.errors`: idempotence
    state lost, or ``enable.gapless.guarantee`` unable to hold) makes every
    later call of that producer fail. Every sending in flight then ends: each
    record the broker had not acknowledged gets an *outage* outcome (the
    relay retries it and never parks it for this), and the producer is
    replaced by a new one at once. A record's own error (say, too large for
    the topic) keeps its own outcome.

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
        self._metadata_timeout = min(TOPIC_CHECK_WAIT, timeout_ms / 1000)
        # Topics the broker confirmed, or left unanswered (see _refused_topics).
        self._writable: set[str] = set()
        self._flights: list[_Flight] = []  # sends with records still waiting for reports

    def sibling(self) -> KafkaPublisher:
        """A new publisher with this one's configuration and a producer of its own.

        A relay's lane groups each publish through their own producer, so one
        group's flush never waits for another's records (see
        :mod:`producer_outbox.group`).
        """
        return KafkaPublisher(self._config, self._factory)

    def publish(self, records: Sequence[Record]) -> list[Outcome]:
        """Send ``records`` and wait until each has its outcome (:meth:`send`, :meth:`serve`)."""
        sending = self.send(records)
        while not sending.done:
            self.serve(1.0)
        return [outcome or _LATE for outcome in sending.outcomes]

    def send(self, records: Sequence[Record]) -> Sending:
        """Produce every record; return their :class:`Sending` at once (see :class:`Streaming`)."""
        flight = _Flight(records, time.monotonic() + self._flush_timeout)
        sending = flight.sending
        fatal = _Fatal()
        # A key's order spans topics (the outbox orders rows by key, whatever their topic).
        failed_keys: set[bytes] = set()
        refused_topics = self._refused_topics(records)
        for index, record in enumerate(records):
            if fatal.reason is not None:
                break  # the producer can send nothing more; the rest is not delivered
            if record.key is not None and record.key in failed_keys:
                # An earlier record of this key was refused at once (e.g. too large):
                # sending this one would overtake it. It waits, untouched (HELD).
                sending.settle(index, HELD)
                continue
            if record.topic in refused_topics:
                sending.settle(index, refused_topics[record.topic])
            else:
                self._produce(index, record, flight, fatal)
            refused = sending.outcomes[index]  # set already only when produce() refused it
            if record.key is not None and refused is not None and not refused.ok:
                failed_keys.add(record.key)
        if not sending.done:
            self._flights.append(flight)
        if fatal.reason is not None:
            self._replace(fatal.reason)
        return sending

    def serve(self, timeout: float) -> None:
        """See :meth:`Streaming.serve`: poll the producer, then record what it reported."""
        if not self._flights:
            return
        fatal = _Fatal()
        self._serve(fatal, lambda: self._producer.poll(timeout))
        if fatal.reason is None and self._fatal_reports(fatal):
            # A refusal can make the producer fatal (enable.gapless.guarantee):
            # serve its error event now, not in the next batch's produce().
            self._serve(fatal, lambda: self._producer.poll(0))
            self._fatal_reports(fatal)
        if fatal.reason is not None:
            self._replace(fatal.reason)
            return
        now = time.monotonic()
        late = [f for f in self._flights if f.waiting() and now > f.deadline]
        if late:
            # Should not happen (message.timeout.ms bounds every record); drop what
            # is still queued so it cannot go out after a retry of the same row
            # (records of other sendings still queued are purged too: an outage
            # outcome, retried).
            self._producer.purge(in_queue=True, in_flight=False)
            self._serve(fatal, lambda: self._producer.poll(0))
            if fatal.reason is not None:
                self._replace(fatal.reason)
                return
        for flight in self._flights:
            self._record(flight, _LATE if flight in late else None, fatal=False)
        self._flights = [f for f in self._flights if not f.sending.done]

    def _fatal_reports(self, fatal: _Fatal) -> bool:
        """Note a report that says the producer is fatally broken; whether any report failed."""
        failed = False
        for flight in self._flights:
            for index in flight.arrived:
                report = flight.reports[index]
                if isinstance(report, KafkaError):
                    failed = True
                    if is_fatal(report):
                        fatal.saw(report)  # a report that carries only the code _FATAL
        return failed

    def _record(self, flight: _Flight, missing: Outcome | None, *, fatal: bool) -> None:
        """Turn ``flight``'s new reports into outcomes; with ``missing``, finish the rest too."""
        for index in flight.arrived:
            outcome = _reported(flight.reports[index], missing or _LATE, fatal)
            flight.sending.settle(index, outcome)
            if outcome.topic_failure:
                # A topic refused now is asked about again before its next records go.
                self._writable.discard(flight.records[index].topic)
        flight.arrived.clear()
        if missing is not None:
            for index, known in enumerate(flight.sending.outcomes):
                if known is None:
                    flight.sending.settle(index, missing)

    def _refused_topics(self, records: Sequence[Record]) -> dict[str, Outcome]:
        """Ask the broker about topics not yet confirmed; return those it refuses as a whole.

        librdkafka reports a missing topic only in the delivery report, after
        ``topic.metadata.propagation.max.ms``, by which time later records of
        the same keys in other topics may be acknowledged. Asked first, a
        missing or forbidden topic fails its records before any is produced,
        so the later records of their keys are held. So does one this client
        may see but not write (:meth:`_write_denied`). A question the cluster
        leaves unanswered (:data:`TOPIC_CHECK_WAIT`) is not asked again at
        every send: each time, the group would wait for it.
        """
        refused: dict[str, Outcome] = {}
        for topic in sorted({r.topic for r in records} - self._writable):
            try:
                metadata = self._producer.list_topics(topic, timeout=self._metadata_timeout)
            except KafkaException:
                # No answer (the broker asked is down or frozen): the records go, and
                # a refusal in their delivery reports has the topic asked about again.
                self._writable.add(topic)
                continue
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
        flight: _Flight,
        fatal: _Fatal,
    ) -> None:
        callback = flight.report(index)
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
                flight.sending.settle(index, _outcome(error))
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

    def _replace(self, reason: str) -> None:
        """Collect what the failed producer still has to report, then use a new one.

        Every record of every sending in flight gets its outcome now: its
        report if one came (a record's own refusal keeps its error), else an
        outage naming the fatal error.
        """
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
        while any(f.waiting() for f in self._flights) and time.monotonic() < deadline:
            try:
                old.poll(0.1)
            except (KafkaException, SystemError) as exc:  # it is broken: best effort
                log.debug("draining the failed producer: %s", exc)
        missing = Outcome(f"not delivered: the producer failed fatally ({reason})", outage=True)
        for flight in self._flights:
            self._record(flight, missing, fatal=True)
        self._flights = []

    def close(self) -> None:
        """Flush what is left and drop the producer."""
        try:
            self._producer.flush(self._flush_timeout)
        except (KafkaException, SystemError) as exc:
            log.warning("closing the outbox relay's producer: %s", exc)
