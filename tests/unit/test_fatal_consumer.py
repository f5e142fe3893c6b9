"""A fatally broken consumer ends the run; a revoke waits by the consumer's own poll interval."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from kinbox.app import App
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import FatalTransportError
from kinbox.core.event import Event
from kinbox.core.record import Record
from kinbox.core.transport import Partition
from kinbox.testing import FakePublisher, FakeStore, FakeTransport, InlineExecutor, record

pytestmark = pytest.mark.unit

T = "lessons"
FENCED = (
    "fatal consumer error: Static consumer fenced by other consumer with same group.instance.id"
)


def app_of(effect: Any = None) -> App:
    app = App(group_id="g")

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        if effect is not None:
            effect(event)
        tx.effects.append(event.id)

    return app


class BreakingTransport(FakeTransport):
    """A consumer that goes fatal as librdkafka's does.

    At the ``poll_number``-th poll, or as soon as ``broken`` is set, it is
    fatally broken: a commit is refused with the bare code ``_FATAL``, and
    the next poll returns the error event that says why (once; later polls
    return nothing).
    """

    def __init__(self, poll_number: int = 0) -> None:
        super().__init__()
        self.poll_number = poll_number
        self.polls = 0
        self.broken = False
        self.told = False

    def poll(self, max_messages: int, timeout: float) -> list[Record]:
        self.polls += 1
        if self.polls == self.poll_number:
            self.broken = True
        if self.broken:
            if not self.told:
                self.told = True
                raise FatalTransportError(FENCED)
            return []
        return super().poll(max_messages, timeout)

    def commit(self, offsets: Mapping[Partition, int], *, asynchronous: bool = False) -> None:
        if self.broken:
            self.commit_calls.append(dict(offsets))
            raise FatalTransportError("committing: Commit failed: Local: Fatal error (_FATAL)")
        super().commit(offsets, asynchronous=asynchronous)


def runner_for(
    transport: FakeTransport, app: App, *, threads: bool = False, **settings: Any
) -> tuple[Runner, FakeStore]:
    """A runner over fakes; its batches run inside turn() unless ``threads``."""
    store = FakeStore()
    config = Settings(database_url="postgresql:///x", group_id="g", **settings).validate()
    executor = None if threads else InlineExecutor()
    runner = Runner(app, config, transport, store, publisher=FakePublisher(), executor=executor)
    return runner, store


def test_a_fatal_poll_ends_the_run_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    transport = BreakingTransport(poll_number=2)
    transport.append(record(T, 0, 0, "a"))
    runner, store = runner_for(transport, app_of())
    # When the second poll finds the consumer fenced
    with caplog.at_level(logging.ERROR), pytest.raises(FatalTransportError, match="fenced"):
        runner.run()
    # Then the run ends (it does not go on polling: one more poll, for the
    # reason, finds nothing), says why at ERROR, and releases everything;
    # what the first turn committed stays committed
    assert transport.polls == 3
    assert "the Kafka consumer failed fatally" in caplog.text and "fenced" in caplog.text
    assert transport.closed and store.closed
    assert transport.committed == {(T, 0): 1}
    assert store.effects == ["a"]


def test_a_fatal_commit_ends_the_run_instead_of_being_kept_for_later() -> None:
    transport = BreakingTransport()
    transport.append(record(T, 0, 0, "a"))

    def break_it(_event: Event) -> None:
        transport.broken = True  # the consumer goes fatal while the batch runs

    runner, store = runner_for(transport, app_of(break_it))
    with pytest.raises(FatalTransportError, match="fenced") as raised:
        runner.run()
    # The commit was tried once, and not again on the way out (nor on revoke)
    assert len(transport.commit_calls) == 1
    assert transport.closed and store.effects == ["a"]
    # and the error says why, from the event the consumer queued, not just "_FATAL"
    assert "_FATAL" in str(raised.value.__cause__)


@pytest.fixture
def quick_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kinbox.consume.inflight.HOLD_AFTER", 0.05)


@pytest.mark.usefixtures("quick_hold")
def test_revoke_waits_half_the_consumers_own_poll_interval() -> None:
    # Given -X max.poll.interval.ms=2000 (the consumer's value) over the
    # max_poll_interval setting of 300 s, and a shutdown timeout of 30 s
    release, done = threading.Event(), threading.Event()
    still_running: list[bool] = []

    def slow(event: Event) -> None:
        release.wait(5)
        done.set()

    transport = FakeTransport()
    transport.append(record(T, 0, 0, "slow"))
    runner, _ = runner_for(
        transport,
        app_of(slow),
        threads=True,
        session_timeout=1,
        shutdown_timeout=30,
        kafka_overrides={"max.poll.interval.ms": "2000"},
    )
    real_poll = transport.poll

    polls: list[int] = []

    def poll(max_messages: int, timeout: float) -> list[Record]:
        polls.append(1)
        if len(polls) == 2:  # the next turn's poll: the batch is in flight
            # When the partition is revoked while the batch holds it
            transport.revoke([(T, 0)])
            still_running.append(not done.is_set())
            release.set()
        return real_poll(max_messages, timeout)

    transport.poll = poll  # type: ignore[method-assign]
    transport.subscribe([T], runner)
    runner.turn()  # the batch starts on its thread
    runner.turn()  # the loop polls on while it runs
    # Then the revoke gave up after 1 s (half of 2 s), while the batch still ran:
    # with the setting's 300 s it would have waited for the batch to end
    assert still_running == [True]
    assert transport.committed == {}
