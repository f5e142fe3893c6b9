"""How a runner stops: within its bound whatever stops it, and never silently.

A batch that never ends must not hold a stopping worker, whatever stops it:
the wait for it is bounded by ``shutdown_timeout``, its offsets are not
committed, and it is left running (the worker process then exits without
it). A batch that runs long is reported, with where it waits. A middleware
hook asking to exit stops the worker as a handler doing so does
(``test_handler_exits``).
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from kinbox.app import App
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import EnvelopeError, ExitRequested, FatalTransportError, ThreadDied
from kinbox.core.event import Event
from kinbox.core.record import Record
from kinbox.middleware.base import Middleware
from kinbox.ops.exits import EXIT_BAD_INPUT, EXIT_INTERRUPTED
from kinbox.ops.shutdown import ShutdownBound, watch_threads
from kinbox.testing import FakePublisher, FakeStore, record
from tests.unit.test_failures import Harness, T
from tests.unit.test_fatal_consumer import BreakingTransport

pytestmark = pytest.mark.unit

P0, P1 = (T, 0), (T, 1)
HELD_IN_C = 600
"""Seconds a C call keeps the GIL in the bound's test: far past any bound there."""


class Stuck:
    """A handler call that holds its batch until the test lets it go."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def hold(self) -> None:
        self.started.set()
        self.release.wait(60)


class BrokenLayer(Middleware):
    """A middleware whose ``before_batch`` raises for a batch holding record ``broken``."""

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        if any(("event-id", b"broken") in r.headers for r in records):
            raise RuntimeError("a broken middleware")


def stuck_app(stuck: Stuck) -> App:
    app = App(group_id="g", middleware=[BrokenLayer()])

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        if event.id == "stuck":
            stuck.hold()
        tx.effects.append(event.id)

    return app


def fatal(transport: BreakingTransport, runner: Runner) -> None:
    transport.broken = True


def broken_layer(transport: BreakingTransport, runner: Runner) -> None:
    transport.append(record(T, 1, 1, "broken"))


def missing_id(transport: BreakingTransport, runner: Runner) -> None:
    transport.append(record(T, 1, 1, None))


def stopped(transport: BreakingTransport, runner: Runner) -> None:
    runner.stop()


def thread_died(transport: BreakingTransport, runner: Runner) -> None:
    runner.stop(ThreadDied("the event loop of async handlers died"))


@pytest.fixture
def stuck() -> Iterator[Stuck]:
    holder = Stuck()
    yield holder
    holder.release.set()  # the orphan's thread ends with the test


@pytest.mark.parametrize(
    ("trigger", "raised"),
    [
        (fatal, FatalTransportError),
        (broken_layer, RuntimeError),
        (missing_id, EnvelopeError),
        (stopped, None),
        (thread_died, ThreadDied),
    ],
    ids=["fatal-consumer", "middleware-raised", "missing-id-fail", "stop", "thread-died"],
)
def test_a_stop_waits_for_a_stuck_batch_only_until_the_shutdown_timeout(
    stuck: Stuck,
    trigger: Callable[[BreakingTransport, Runner], None],
    raised: type[BaseException] | None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given a batch of partition 0 whose handler never returns (partition 1
    # gets the record that stops the worker, if a record does)
    transport = BreakingTransport()
    transport.append(record(T, 0, 0, "stuck"))
    transport.logs[P1] = [record(T, 1, 0, "applied-before")]
    transport.committed[P1] = 1
    store = FakeStore()
    config = Settings(
        database_url="postgresql:///x", group_id="g", shutdown_timeout=1, missing_id="fail"
    ).validate()
    runner = Runner(stuck_app(stuck), config, transport, store, publisher=FakePublisher())
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            runner.run()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert stuck.started.wait(10)
    # When the worker is stopped, for any reason, while it runs
    trigger(transport, runner)
    thread.join(20)
    # Then the run ends although the batch never does, on its reason
    assert not thread.is_alive(), "the stop waits on the stuck batch without bound"
    (error,) = outcome
    assert type(error) is raised if raised is not None else error is None, error
    # the stuck batch is left running, its offset not committed, its store open
    assert runner.unfinished() == 1
    assert P0 not in transport.committed
    assert "stuck" not in store.effects and not store.closed
    assert f"the batch of {T}[0]@0..0" in caplog.text
    assert "is still running after" in caplog.text
    assert "in apply" in caplog.text and "stuck.hold()" in caplog.text  # where it waits


def test_a_batch_running_long_is_reported_with_where_it_waits_again_and_again(
    stuck: Stuck, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("kinbox.consume.inflight.STUCK_AFTER", 0.2)
    h = Harness(stuck_app(stuck), threads=True)
    h.add(record(T, 0, 0, "stuck"))
    h.run()
    assert stuck.started.wait(10)
    with caplog.at_level(logging.WARNING, logger="kinbox.consume.inflight"):
        for _ in range(50):
            h.runner.turn()
            threading.Event().wait(0.02)
    reports = [r for r in caplog.records if "has been running for" in r.getMessage()]
    assert len(reports) >= 2, caplog.text
    assert {r.levelno for r in reports} == {logging.WARNING}
    message = reports[-1].getMessage()
    assert f"{T}[0]@0..0 (handler tests.unit.test_stops.stuck_app.<locals>.apply)" in message
    assert "stuck.hold()" in message and "self.release.wait(60)" in message


def test_a_middleware_hook_asking_to_exit_stops_the_worker() -> None:
    class Exiting(Middleware):
        def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
            sys.exit(4)

    app = App(group_id="g", middleware=[Exiting()])

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        tx.effects.append(event.id)

    h = Harness(app)
    h.add(record(T, 0, 0, "a"))
    with pytest.raises(ExitRequested, match="raised SystemExit: 4") as raised:
        h.run()
    assert isinstance(raised.value.__cause__, SystemExit)
    assert h.store.effects == [] and h.committed is None


# -- the process's own bound (kinbox worker) --


def test_the_bound_ends_the_process_with_the_first_reasons_status() -> None:
    ended: list[int] = []
    done = threading.Event()

    def give_up(status: int) -> None:
        ended.append(status)
        done.set()

    bound = ShutdownBound(0.1, give_up)
    bound.begin(EXIT_BAD_INPUT, "missing_id=fail")
    bound.begin(EXIT_INTERRUPTED, "SIGTERM")  # a later reason changes nothing
    assert done.wait(10)
    assert ended == [EXIT_BAD_INPUT] and bound.status == EXIT_BAD_INPUT


def test_the_bound_ends_a_process_whose_main_thread_holds_the_gil_in_a_c_call() -> None:
    # Given a stop whose bound is armed as kinbox worker arms it, and then the
    # main thread blocked in a C call that keeps the GIL (as confluent-kafka's
    # binding does when librdkafka leaves a rebalance's unassign unanswered
    # inside close()), so that no Python thread runs again
    script = textwrap.dedent(f"""
        import ctypes
        from kinbox.ops import last_resort
        from kinbox.ops.shutdown import ShutdownBound
        bound = ShutdownBound(1.0, last_resort=last_resort.arm)
        bound.begin({EXIT_BAD_INPUT}, "missing_id=fail")
        ctypes.PyDLL(None).sleep({HELD_IN_C})
    """)
    # When it runs
    ended = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    # Then it still ends with the stop's status (long before the C call would
    # return), and its stderr says where each thread was
    assert ended.returncode == EXIT_BAD_INPUT, ended.stderr.decode()
    assert b"Timeout" in ended.stderr and b"most recent call first" in ended.stderr


def test_a_kinbox_thread_that_dies_is_told_and_others_go_to_the_hook_before(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    before: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: before.append(args.thread.name))
    deaths: list[ThreadDied] = []
    watch_threads(deaths.append)

    def die() -> None:
        raise ValueError("a bug")

    for name in ("kinbox-something", "users-own"):
        thread = threading.Thread(target=die, name=name)
        thread.start()
        thread.join()
    (death,) = deaths
    assert "thread kinbox-something died: ValueError: a bug" in str(death)
    assert isinstance(death.__cause__, ValueError)
    assert before == ["users-own"]
    assert "thread kinbox-something died: ValueError: a bug; stopping the worker" in caplog.text
