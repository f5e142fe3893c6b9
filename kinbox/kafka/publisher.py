""":class:`KafkaPublisher`: the one producer of kinbox, for dead letters, replays and the relay.

It implements :class:`~kinbox.core.publisher.Publisher` over an idempotent
confluent-kafka ``Producer`` (no duplicates or reordering from the client's
own retries) and reports the delivery of every message. The only module that
creates a confluent-kafka ``Producer``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from kinbox.core.publisher import HELD, Outcome, OutgoingRecord, Sending, wait
from kinbox.kafka.deliveries import LATE, Fatal, PendingSend, outcome, reported
from kinbox.kafka.errors import ClientLog, broken, create_client, is_fatal
from kinbox.kafka.producer_config import producer_config
from kinbox.kafka.topic_checks import TOPIC_CHECK_WAIT, AdminFactory, TopicChecks

if TYPE_CHECKING:
    from kinbox.core.config import Settings

log = logging.getLogger(__name__)


class KafkaPublisher:
    """A :class:`~kinbox.core.publisher.Publisher` over an idempotent confluent-kafka producer.

    A fatal producer error (see :mod:`kinbox.kafka.errors`: idempotence
    state lost, or ``enable.gapless.guarantee`` unable to hold) makes every
    later call of that producer fail. Every sending in flight then ends: each
    message the broker had not acknowledged gets an *outage* outcome (sent
    again, never blamed on the message), and the producer is replaced by a
    new one at once. A message's own error (say, too large for the topic)
    keeps its own outcome.

    Args:
        config: the producer configuration.
        factory: creates the producer from ``config`` (a seam for tests).
        admin_factory: creates the admin client that asks whether a topic
            may be written (``None``: don't ask; a seam for tests).
        check_topics: ask about each topic before its first message
            (:mod:`.topic_checks`).
        name: the producer's name in logs and errors.
        logger: the logger librdkafka's own lines go to.
        close_wait: how long :meth:`close` waits for what is left, in seconds
            (``None``: as long as a message may take, ``message.timeout.ms``
            and a margin).

    Raises:
        ConfigurationError: librdkafka refused the configuration (``-X``).
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        factory: Callable[[dict[str, Any]], Producer] = Producer,
        admin_factory: AdminFactory | None = AdminClient,
        *,
        check_topics: bool = True,
        name: str = "the Kafka producer",
        logger: str = "kinbox.kafka",
        close_wait: float | None = None,
    ) -> None:
        self._config = dict(config)
        self._factory = factory
        self._admin_factory = admin_factory
        self._name, self._logger, self._close_wait = name, logger, close_wait
        self._producer = self._create()
        # After the client accepted the configuration, so the value is a number.
        timeout_ms = int(self._config.get("message.timeout.ms", "300000"))
        self._flush_timeout = timeout_ms / 1000 + 5.0
        self.replaced = 0
        """How many times a fatally failed producer was replaced."""
        wait_s = min(TOPIC_CHECK_WAIT, timeout_ms / 1000)
        self._topics = (
            TopicChecks(self._config, admin_factory, wait_s, name) if check_topics else None
        )
        self._flights: list[PendingSend] = []  # sends with messages still waiting for reports

    def sibling(self) -> KafkaPublisher:
        """A new publisher with this one's configuration and a producer of its own.

        A relay's lane groups each publish through their own producer, so one
        group's flush never waits for another's messages (see
        :mod:`producer_outbox.group`).
        """
        return KafkaPublisher(
            self._config, self._factory, self._admin_factory,
            check_topics=self._topics is not None, name=self._name, logger=self._logger,
            close_wait=self._close_wait,
        )  # fmt: skip

    def publish(self, messages: Sequence[OutgoingRecord]) -> list[Outcome]:
        """Send ``messages`` and wait until each has its outcome (:meth:`send`, :meth:`serve`)."""
        return wait(self, self.send(messages))

    def send(self, messages: Sequence[OutgoingRecord]) -> Sending:
        """See :meth:`~kinbox.core.publisher.Publisher.send`: produce every message."""
        flight = PendingSend(messages, time.monotonic() + self._flush_timeout)
        sending = flight.sending
        fatal = Fatal()
        # A key's order spans topics (the outbox orders rows by key, whatever their topic).
        failed_keys: set[bytes] = set()
        refused_topics = (
            {} if self._topics is None
            else self._topics.refused(self._producer, {m.topic for m in messages})
        )  # fmt: skip
        for index, message in enumerate(messages):
            if fatal.reason is not None:
                break  # the producer can send nothing more; the rest is not delivered
            if message.key is not None and message.key in failed_keys:
                # An earlier message of this key was refused at once (e.g. too large):
                # sending this one would overtake it. It waits, untouched (HELD).
                sending.settle(index, HELD)
                continue
            if message.topic in refused_topics:
                sending.settle(index, refused_topics[message.topic])
            else:
                self._produce(index, message, flight, fatal)
            refused = sending.outcomes[index]  # set already only when produce() refused it
            if message.key is not None and refused is not None and not refused.ok:
                failed_keys.add(message.key)
        if not sending.done:
            self._flights.append(flight)
        if fatal.reason is not None:
            self._replace(fatal.reason)
        return sending

    def serve(self, timeout: float) -> None:
        """See :meth:`~kinbox.core.publisher.Publisher.serve`: poll, then record the reports."""
        if not self._flights:
            return
        fatal = Fatal()
        self._serve(fatal, lambda: self._producer.poll(timeout))
        if fatal.reason is None and self._fatal_reports(fatal):
            # A refusal can make the producer fatal (enable.gapless.guarantee):
            # serve its error event now, not in the next send's produce().
            self._serve(fatal, lambda: self._producer.poll(0))
            self._fatal_reports(fatal)
        if fatal.reason is not None:
            self._replace(fatal.reason)
            return
        now = time.monotonic()
        late = [f for f in self._flights if f.waiting() and now > f.deadline]
        if late:
            # Should not happen (message.timeout.ms bounds every message); drop what
            # is still queued so it cannot go out after a retry of the same one
            # (messages of other sendings still queued are purged too: an outage
            # outcome, retried).
            self._producer.purge(in_queue=True, in_flight=False)
            self._serve(fatal, lambda: self._producer.poll(0))
            if fatal.reason is not None:
                self._replace(fatal.reason)
                return
        for flight in self._flights:
            self._record(flight, LATE if flight in late else None, fatal=False)
        self._flights = [f for f in self._flights if not f.sending.done]

    def close(self) -> None:
        """See :meth:`~kinbox.core.publisher.Publisher.close`."""
        try:
            wait_s = self._flush_timeout if self._close_wait is None else self._close_wait
            self._producer.flush(wait_s)
        except (KafkaException, SystemError) as exc:
            log.warning("closing %s: %s", self._name, exc)

    def _fatal_reports(self, fatal: Fatal) -> bool:
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

    def _record(self, flight: PendingSend, missing: Outcome | None, *, fatal: bool) -> None:
        """Turn ``flight``'s new reports into outcomes; with ``missing``, finish the rest too."""
        for index in flight.arrived:
            known = reported(flight.reports[index], missing or LATE, fatal)
            flight.sending.settle(index, known)
            if known.topic_failure and self._topics is not None:
                self._topics.forget(flight.messages[index].topic)
        flight.arrived.clear()
        if missing is not None:
            for index, found in enumerate(flight.sending.outcomes):
                if found is None:
                    flight.sending.settle(index, missing)

    def _produce(
        self, index: int, message: OutgoingRecord, flight: PendingSend, fatal: Fatal
    ) -> None:
        callback = flight.report(index)
        while True:
            try:
                self._producer.produce(
                    message.topic,
                    value=message.value,
                    key=message.key,
                    # The message's own list (made for it, never kept): no copy.
                    # Invariance alone makes the stubs refuse it.
                    headers=message.headers,  # type: ignore[arg-type]
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
                flight.sending.settle(index, outcome(error))
                return

    def _serve(self, fatal: Fatal, call: Callable[[], int]) -> bool:
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
        self._log = ClientLog(logging.getLogger(self._logger))
        config: dict[str, Any] = {**self._config, "logger": self._log}
        return create_client(self._factory, config, self._name)

    def _replace(self, reason: str) -> None:
        """Collect what the failed producer still has to report, then use a new one.

        Every message of every sending in flight gets its outcome now: its
        report if one came (a message's own refusal keeps its error), else an
        outage naming the fatal error.
        """
        log.error(
            "%s failed fatally (%s); replacing it. Messages it had not acknowledged count "
            "as not sent, are sent again, and are never blamed for it",
            self._name, reason,
        )  # fmt: skip
        old, self._producer = self._producer, self._create()
        self.replaced += 1
        try:
            # Nothing of the old one may still go out behind a retry.
            old.purge(in_queue=True, in_flight=True, blocking=False)
        except (KafkaException, SystemError) as exc:
            log.debug("purging the failed producer: %s", exc)
        # The fatal error stopped the poll that raised it: the reports it had
        # not served yet (a message's own refusal, the purged ones) come now.
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


def dead_letter_publisher(
    settings: Settings,
    factory: Callable[[dict[str, Any]], Producer] = Producer,
    *,
    max_record_bytes: int | None = None,
) -> KafkaPublisher:
    """The publisher of dead letters and replays: :func:`producer_config`, no topic checks.

    Args:
        settings: brokers and ``-X`` overrides.
        factory: creates the producer from its configuration (a seam for tests).
        max_record_bytes: the largest record to be sent (the dead-letter
            topics' limit); raises the client's own ``message.max.bytes``
            (default 1,000,000, below a topic's default of 1,048,588) so the
            client never refuses what the topic would take. ``-X`` wins.

    Raises:
        ConfigurationError: librdkafka refused the configuration (``-X``).
    """
    config = producer_config(settings)
    if max_record_bytes is not None and "message.max.bytes" not in settings.kafka_overrides:
        # librdkafka's bounds for the setting.
        config["message.max.bytes"] = min(max(max_record_bytes, 1000), 1_000_000_000)
    return KafkaPublisher(
        config, factory, None, check_topics=False, name="the dead-letter producer", close_wait=5.0
    )
