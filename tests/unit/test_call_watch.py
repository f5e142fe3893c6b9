"""A call into the Kafka client that never returns is said at WARNING, then ends the worker.

Fault scenario 6b (broker SIGSTOPped past the session timeout) once left a
worker inside confluent-kafka's synchronous commit for good, saying nothing:
librdkafka 2.16 lost the commit's reply and the binding waits for it forever.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from kinbox.cli.support import EXIT_FATAL
from kinbox.core.config import Settings
from kinbox.kafka.consumer import KafkaTransport
from kinbox.kafka.watch import CallWatch
from kinbox.ops.worker import EXIT_WEDGED

pytestmark = pytest.mark.unit

WATCH = "kinbox.kafka.watch"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watched(give_up_after: float = 60.0) -> tuple[CallWatch, Clock, list[str]]:
    clock, wedged = Clock(), list[str]()
    watch = CallWatch(30.0, give_up_after, wedged.append, clock=clock)
    return watch, clock, wedged


def test_a_call_within_the_bound_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    watch, clock, wedged = watched()
    with caplog.at_level(logging.WARNING, WATCH), watch.call("polling"):
        clock.now += 29
        watch.check()
    watch.check()  # nothing in progress
    assert caplog.records == [] and wedged == []


def test_a_call_that_does_not_return_is_said_with_the_stack_then_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch, clock, wedged = watched(give_up_after=100.0)

    def commit_that_never_returns() -> None:
        # Given the polling thread stuck in a commit
        with watch.call("committing {('t', 0): 50}"):
            clock.now += 31
            # When the watch looks
            watch.check()
            watch.check()  # said once per warn_after, not every look
            clock.now += 30
            watch.check()

    with caplog.at_level(logging.WARNING, WATCH):
        commit_that_never_returns()
    # Then it said which call, for how long, and where the thread is
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings
    assert "has not returned from committing {('t', 0): 50} for 31s" in warnings[0]
    assert "commit_that_never_returns" in warnings[0]
    assert "for 61s" in warnings[1] and wedged == []


def test_past_give_up_after_the_worker_is_ended(caplog: pytest.LogCaptureFixture) -> None:
    watch, clock, wedged = watched()
    with caplog.at_level(logging.ERROR, WATCH), watch.call("polling"):
        clock.now += 60
        watch.check()
    assert len(wedged) == 1
    assert "not returned from polling for 60s" in wedged[0]
    assert "librdkafka is stuck" in caplog.text


def test_a_nested_call_hands_the_watch_back_to_the_outer_one() -> None:
    watch, clock, wedged = watched()
    with watch.call("polling"):  # a rebalance callback commits inside poll
        clock.now += 40
        with watch.call("committing {}"):
            clock.now += 1
        clock.now += 20
        watch.check()  # the poll has now lasted 61s
    assert len(wedged) == 1 and "from polling" in wedged[0]


class StuckConsumer:
    """confluent-kafka's consumer as seen in scenario 6b: its synchronous commit never returns."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def commit(self, **_: Any) -> Any:
        self.gate.wait()
        return []


def test_kafka_transport_ends_a_commit_the_client_never_returns_from() -> None:
    settings = Settings(
        bootstrap_servers="127.0.0.1:9", database_url="postgresql:///x", group_id="g",
        session_timeout=1, max_poll_interval=1,
    ).validate()  # fmt: skip
    wedged = threading.Event()
    transport = KafkaTransport(settings, on_wedged=lambda reason: wedged.set())
    real, stuck = transport._consumer, StuckConsumer()
    transport._consumer = stuck  # type: ignore[assignment]
    transport._watch.start()  # subscribe() starts it; this consumer never subscribes
    polling_thread = threading.Thread(target=transport.commit, args=({("t", 0): 5},))
    try:
        polling_thread.start()
        # Twice the poll interval (1 s here), and the worker's hook is called.
        assert wedged.wait(30), "the watch never gave up on the stuck commit"
    finally:
        stuck.gate.set()
        polling_thread.join(10)
        transport._consumer = real
        transport.close()


def test_the_wedged_exit_status_is_the_fatal_client_status() -> None:
    assert EXIT_WEDGED == EXIT_FATAL
