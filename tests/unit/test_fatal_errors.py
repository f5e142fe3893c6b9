"""Fatal librdkafka errors are recognised in every shape, and a fatal producer is replaced.

The producers here are stubs at the ``factory`` seam of the two publishers:
they raise and report exactly what confluent-kafka 2.16 was seen to raise and
report when a real idempotent producer went fatal (the integration tests
make a real one go fatal; see tests/integration/test_fatal_producers.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from kinbox.cli.main import EXIT_CONFIG, EXIT_FATAL, main
from kinbox.cli.support import guard
from kinbox.core.config import Settings
from kinbox.core.errors import ConfigurationError, FatalTransportError, TransportError
from kinbox.core.publisher import OutgoingRecord, deliver
from kinbox.kafka.errors import (
    ClientLog,
    broken,
    create_client,
    fatal_error,
    is_fatal,
    translate,
)
from kinbox.kafka.publisher import KafkaPublisher, dead_letter_publisher
from producer_outbox.producer import producer_config, relay_publisher

pytestmark = pytest.mark.unit

# What a delivery report, a consumed error event or a refused produce() carries:
# the code alone, fatal() false.
CODE_ONLY = KafkaError(KafkaError._FATAL)
# What a poll()/flush() raises through the binding's error callback path.
UNDERLYING = KafkaError(KafkaError._GAPLESS_GUARANTEE, "gap-less guarantee broken", fatal=True)


def system_error_with_fatal_cause() -> SystemError:
    """The SystemError a flush raises when a delivery report ran with the fatal error pending."""
    try:
        try:
            raise KafkaException(UNDERLYING)
        except KafkaException as fatal:
            raise SystemError("<method 'topic'> returned a result with an exception set") from fatal
    except SystemError as exc:
        return exc


def test_fatal_is_recognised_by_code_and_by_flag() -> None:
    assert not CODE_ONLY.fatal()  # the trap: the flag is false on code-only errors
    assert is_fatal(CODE_ONLY)
    assert is_fatal(UNDERLYING)
    assert not is_fatal(KafkaError(KafkaError._MSG_TIMED_OUT))
    assert not is_fatal(None)


def test_fatal_error_follows_the_exception_chain() -> None:
    assert fatal_error(system_error_with_fatal_cause()) is not None
    assert fatal_error(KafkaException(CODE_ONLY)) is not None
    assert fatal_error(SystemError("unrelated")) is None
    assert fatal_error(KafkaException(KafkaError(KafkaError._TRANSPORT))) is None


def test_a_client_is_broken_by_a_fatal_error_or_a_failure_of_the_binding() -> None:
    assert "gap-less" in (broken(system_error_with_fatal_cause()) or "")
    # The other shape seen: the binding lost the fatal exception altogether
    lost = SystemError("<method 'flush'> returned NULL without setting an exception")
    assert "binding failed" in (broken(lost) or "")
    assert broken(KafkaException(KafkaError(KafkaError._TRANSPORT))) is None


def test_translate_makes_fatal_errors_fatal_transport_errors() -> None:
    # A commit refused by a fatally broken consumer carries only the code
    fatal = translate("committing", KafkaException(CODE_ONLY))
    assert isinstance(fatal, FatalTransportError) and not fatal.retriable
    fenced = translate("committing", KafkaException(KafkaError(KafkaError.FENCED_INSTANCE_ID)))
    assert type(fenced) is TransportError and not fenced.retriable
    outage = translate("committing", KafkaException(KafkaError(KafkaError._TRANSPORT)))
    assert type(outage) is TransportError and outage.retriable


REFUSED = [
    {"no.such.property": "1"},
    {"acks": "banana"},
    {"error_cb": "not-a-function"},
]


@pytest.mark.parametrize(
    ("factory", "config"),
    [(f, c) for f in (Producer, Consumer) for c in REFUSED]
    + [(Producer, {"enable.gapless.guarantee": "true", "enable.idempotence": "false"})],
)
def test_a_refused_configuration_is_a_configuration_error(
    factory: Callable[[dict[str, Any]], Any], config: dict[str, str]
) -> None:
    full = {"bootstrap.servers": "127.0.0.1:1", "group.id": "g", **config}
    with pytest.raises(ConfigurationError, match="invalid Kafka configuration for the client"):
        create_client(factory, full, "the client")


def test_the_cli_maps_fatal_and_configuration_errors_to_their_exit_codes() -> None:
    def fail(exc: Exception) -> Callable[[], None]:
        def action() -> None:
            raise exc

        return action

    with pytest.raises(SystemExit) as fatal:
        guard(fail(FatalTransportError("fenced")))
    assert fatal.value.code == EXIT_FATAL == 7
    with pytest.raises(SystemExit) as config:
        guard(fail(ConfigurationError("bad -X")))
    assert config.value.code == EXIT_CONFIG


def test_worker_with_a_property_librdkafka_refuses_exits_with_the_config_code() -> None:
    # No service is needed: the clients are created (and refuse) before any connection.
    result = CliRunner().invoke(
        main,
        ["worker", "tests.unit.sample_app:app", "--database-url", "postgresql://u@127.0.0.1:1/x",
         "--bootstrap-servers", "127.0.0.1:1", "-X", "no.such.property=1"],
    )  # fmt: skip
    assert result.exit_code == EXIT_CONFIG, result.output
    assert "no.such.property" in result.output


# -- the dead-letter publisher --


class StubMessage:
    def __init__(self, topic: str) -> None:
        self._topic = topic

    def topic(self) -> str:
        return self._topic


class StubProducer:
    """Queues records; ``flush`` reports them, or fails the way a fatal producer does."""

    def __init__(self, config: dict[str, Any], script: list[str]) -> None:
        self.config = config
        self.script = script  # what each produce/flush does, in order
        self.queued: list[tuple[str, Any]] = []
        self.delivered: list[str] = []
        self.purged = False

    def _next(self) -> str:
        return self.script.pop(0) if self.script else "ok"

    def produce(self, topic: str, **kw: Any) -> None:
        if self._next() == "refuse-fatal":
            raise KafkaException(CODE_ONLY)
        self.queued.append((topic, kw["on_delivery"]))

    def flush(self, timeout: float = -1) -> int:
        return self.poll(timeout)

    def list_topics(self, topic: str, timeout: float = -1) -> Any:
        # The relay asks about a topic before its first record; every topic exists here.
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None)})

    def poll(self, timeout: float = -1) -> int:
        action = self._next()
        if action in ("ack-one-then-raise-fatal", "too-large-then-raise-fatal"):
            # What the real producer did: the record the broker refused is
            # reported with the broker's error, then the flush raises.
            topic, callback = self.queued.pop(0)
            callback(None if action.startswith("ack") else KafkaError(10), StubMessage(topic))
            action = "raise-fatal"
        if action == "raise-fatal":
            raise system_error_with_fatal_cause()
        if action == "raise-null":
            raise SystemError("<method 'flush'> returned NULL without setting an exception")
        errors = {
            "report-fatal": CODE_ONLY,
            "report-too-large": KafkaError(10),
            "report-purged": KafkaError(KafkaError._PURGE_INFLIGHT),
        }
        queued, self.queued = self.queued, []
        for topic, callback in queued:
            error = errors.get(action)
            callback(error, StubMessage(topic))
            if error is None:
                self.delivered.append(topic)
        return 0

    def purge(self, **kw: Any) -> None:
        # Every record still queued is reported as purged at the next poll.
        self.purged = True
        self.script = ["report-purged"]


class Factory:
    """Hands out stub producers, each with its own script."""

    def __init__(self, *scripts: list[str]) -> None:
        self.scripts = list(scripts)
        self.made: list[StubProducer] = []

    def __call__(self, config: dict[str, Any]) -> Any:
        producer = StubProducer(config, self.scripts.pop(0) if self.scripts else [])
        self.made.append(producer)
        return producer


LETTER = OutgoingRecord("t.dlq", None, b"v", [])


def dlq_publisher(factory: Factory) -> KafkaPublisher:
    return dead_letter_publisher(Settings(bootstrap_servers="127.0.0.1:1"), factory=factory)


@pytest.mark.parametrize(
    "script",
    [
        ["ok", "raise-fatal"],  # flush raises (SystemError, the fatal error as its cause)
        ["ok", "raise-null"],  # flush raises a SystemError without a cause
        ["ok", "report-fatal"],  # the delivery report says _FATAL
        ["refuse-fatal"],  # produce() refuses with _FATAL
    ],
)
def test_dead_letter_publisher_replaces_a_fatal_producer_and_fails_the_batch(
    script: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    factory = Factory(script)
    publisher = dlq_publisher(factory)
    # When the producer goes fatal during one batch's send/flush
    with caplog.at_level(logging.ERROR), pytest.raises(TransportError) as failed:
        deliver(publisher, [LETTER])
    # Then the batch fails as an outage (rolled back and tried again), not for good
    assert failed.value.retriable and "fatal" in str(failed.value).lower()
    assert publisher.replaced == 1 and len(factory.made) == 2 and factory.made[0].purged
    assert "dead-letter producer failed fatally" in caplog.text
    # And the next try goes out on the new producer
    deliver(publisher, [LETTER])
    assert factory.made[1].delivered == ["t.dlq"]


def test_dead_letter_publisher_keeps_a_producer_whose_record_failed() -> None:
    factory = Factory(["ok", "report-too-large"])
    publisher = dlq_publisher(factory)
    with pytest.raises(TransportError, match="produce failed"):
        deliver(publisher, [LETTER])
    assert publisher.replaced == 0 and len(factory.made) == 1


# -- the outbox relay's publisher --


def relay(factory: Factory) -> KafkaPublisher:
    config = producer_config("127.0.0.1:1", {})
    return relay_publisher(config, factory=factory, admin_factory=None)


RECORDS = [
    OutgoingRecord("t", b"a", b"1", []),
    OutgoingRecord("t", b"b", b"2", []),
    OutgoingRecord("u", b"c", b"3", []),
]


@pytest.mark.parametrize(
    "script",
    [
        ["ok", "ok", "ok", "raise-fatal"],
        ["ok", "ok", "ok", "raise-null"],
        ["ok", "ok", "ok", "report-fatal"],
        ["ok", "refuse-fatal"],
    ],
)
def test_relay_never_parks_rows_for_a_fatal_producer_and_replaces_it(script: list[str]) -> None:
    factory = Factory(script)
    publisher = relay(factory)
    outcomes = publisher.publish(RECORDS)
    # Then nothing of the batch counts as sent, and no row is marked bad for it
    assert [o.ok for o in outcomes] == [False, False, False]
    assert all(o.outage for o in outcomes), outcomes
    assert publisher.replaced == 1 and factory.made[0].purged
    # And the next batch goes out on the new producer
    assert all(o.ok for o in publisher.publish(RECORDS))
    assert factory.made[1].delivered == ["t", "t", "u"]


def test_relay_keeps_what_was_acknowledged_before_the_producer_went_fatal() -> None:
    factory = Factory(["ok", "ok", "ok", "ack-one-then-raise-fatal"])
    outcomes = relay(factory).publish(RECORDS)
    # The first record is in Kafka: marked sent; the others are retried, never parked
    assert outcomes[0].ok
    assert all(not o.ok and o.outage and "fatally" in (o.error or "") for o in outcomes[1:])


def test_relay_keeps_a_records_own_error_alongside_a_fatal_producer() -> None:
    # A record the broker refused (too large) is that record's failure even if
    # its refusal made the producer fatal (enable.gapless.guarantee): it may
    # still be parked; the rest of the batch may not.
    factory = Factory(["ok", "ok", "ok", "too-large-then-raise-fatal"])
    outcomes = relay(factory).publish(RECORDS)
    assert not outcomes[0].ok and not outcomes[0].outage and "SIZE" in (outcomes[0].error or "")
    assert all(not o.ok and o.outage for o in outcomes[1:])


def test_supervisor_reports_a_member_status_as_a_shell_would() -> None:
    from kinbox.ops.supervisor import status

    assert [status(7), status(0), status(-9), status(-15), status(None)] == [7, 0, 137, 143, 1]


def test_a_systemerror_without_a_cause_is_explained_by_the_fatal_line_librdkafka_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given the client's log saw librdkafka's FATAL line (as the binding calls it)
    log = ClientLog(logging.getLogger("kinbox.kafka"))
    with caplog.at_level(logging.INFO, logger="kinbox.kafka"):
        log.log(logging.INFO, "%s [%s] %s", "CONFWARN", "rdkafka#producer-1", "experimental")
        log.log(logging.CRITICAL, "%s [%s] %s", "FATAL", "rdkafka#producer-1", "Gap-less: lost")
    # When the binding then loses the error itself (no __cause__)
    lost = SystemError("<method 'flush'> returned NULL without setting an exception")
    # Then the reason is the logged one, and the line was forwarded to the logger
    reason = broken(lost, log)
    assert reason is not None and reason.startswith("Gap-less: lost")
    assert [r.getMessage() for r in caplog.records][
        -1
    ] == "FATAL [rdkafka#producer-1] Gap-less: lost"
    # and without such a line, the binding's failure is still reported as fatal
    assert "binding failed" in (broken(lost, ClientLog(logging.getLogger("x"))) or "")
