"""The relay's upkeep scheduler (producer_outbox.schedule), on a fake clock."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from kinbox.core.errors import ConfigurationError
from producer_outbox.schedule import Scheduler

pytestmark = pytest.mark.unit


class Clock:
    """A monotonic clock that moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def recorder(
    log: list[str], name: str, takes: float = 0.0, clock: Clock | None = None
) -> Callable[[str], None]:
    """A task body that notes its run (with its context) and takes ``takes`` seconds."""

    def run(context: str) -> None:
        log.append(f"{name}:{context}")
        if clock is not None:
            clock.now += takes

    return run


def test_due_tasks_run_earliest_first_ties_in_the_order_added(clock: Clock) -> None:
    ran: list[str] = []
    upkeep: Scheduler[str] = Scheduler(clock=clock)
    upkeep.add("b", 10, recorder(ran, "b"), delay=1)
    upkeep.add("a", 10, recorder(ran, "a"))
    upkeep.add("c", 10, recorder(ran, "c"))
    upkeep.add("later", 10, recorder(ran, "later"), delay=5)
    clock.now += 1
    # a and c were due first (ties: the order added), b one second later; "later" not yet.
    assert upkeep.run_due("conn") == ["a", "c", "b"]
    assert ran == ["a:conn", "c:conn", "b:conn"]


def test_a_task_is_due_again_an_interval_after_its_run_ended(clock: Clock) -> None:
    ran: list[str] = []
    upkeep: Scheduler[str] = Scheduler(clock=clock)
    upkeep.add("t", 3, recorder(ran, "t", takes=0.5, clock=clock))
    assert upkeep.run_due("x") == ["t"]
    task = upkeep.get("t")
    assert task is not None and task.due == pytest.approx(103.5)
    clock.now = 103.4
    assert upkeep.run_due("x") == []
    clock.now = 103.5
    assert upkeep.run_due("x") == ["t"]


def test_a_failing_task_is_logged_and_rescheduled_and_the_others_still_run(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[str] = []

    def broken(_context: str) -> None:
        ran.append("broken")
        raise RuntimeError("disk on fire")

    upkeep: Scheduler[str] = Scheduler(clock=clock)
    upkeep.add("broken", 60, broken)
    upkeep.add("fine", 60, recorder(ran, "fine"))
    with caplog.at_level(logging.ERROR, logger="producer_outbox.schedule"):
        assert upkeep.run_due("x") == ["broken", "fine"]
    assert ran == ["broken", "fine:x"]
    (record,) = caplog.records
    assert "'broken' failed; next try in 60.0s" in record.getMessage()
    assert record.exc_info is not None and "disk on fire" in str(record.exc_info[1])
    # Then it is tried again one interval later, not at once.
    clock.now += 59
    assert upkeep.run_due("x") == []
    clock.now += 1
    assert upkeep.run_due("x") == ["broken", "fine"]


def test_a_propagating_error_passes_through_after_rescheduling(clock: Clock) -> None:
    class LostConnection(Exception):
        pass

    ran: list[str] = []

    def lost(_context: str) -> None:
        raise LostConnection

    upkeep: Scheduler[str] = Scheduler(
        clock=clock, passes=lambda exc: isinstance(exc, LostConnection)
    )
    upkeep.add("lost", 5, lost)
    upkeep.add("next", 5, recorder(ran, "next"))
    with pytest.raises(LostConnection):
        upkeep.run_due("x")
    assert ran == [], "the loop answers the error (reconnects) before more upkeep"
    task = upkeep.get("lost")
    assert task is not None and task.due == 105.0
    assert upkeep.run_due("x") == ["next"]


def test_a_slow_task_delays_the_loop_but_never_starves_it(clock: Clock) -> None:
    # Given a task that takes five times its interval and one that falls due
    # while it runs, when the loop alternates upkeep with its own work (a
    # second of batches),
    events: list[str] = []
    upkeep: Scheduler[str] = Scheduler(clock=clock)
    upkeep.add("slow", 1, recorder(events, "slow", takes=5, clock=clock))
    upkeep.add("quick", 10, recorder(events, "quick"), delay=2)
    for _ in range(3):
        upkeep.run_due("x")
        events.append("batches")
        clock.now += 1
    # then each call runs the slow task at most once, the loop's work runs
    # between any two of its runs, and the task that fell due meanwhile waits
    # for the next call instead of piling onto this one.
    assert events == [
        "slow:x", "batches",
        "quick:x", "slow:x", "batches",
        "slow:x", "batches",
    ]  # fmt: skip


def test_stop_runs_no_further_task(clock: Clock) -> None:
    ran: list[str] = []
    stopping = False

    def stop_now(_context: str) -> None:
        nonlocal stopping
        ran.append("stop")
        stopping = True

    upkeep: Scheduler[str] = Scheduler(clock=clock)
    upkeep.add("stop", 1, stop_now)
    upkeep.add("after", 1, recorder(ran, "after"))
    assert upkeep.run_due("x", should_stop=lambda: stopping) == ["stop"]
    assert upkeep.run_due("x", should_stop=lambda: stopping) == []
    assert ran == ["stop"]


def test_remove_and_replace(clock: Clock) -> None:
    ran: list[str] = []
    upkeep: Scheduler[str] = Scheduler(clock=clock)
    upkeep.add("gone", 1, recorder(ran, "gone"))
    upkeep.add("lanes", 1, recorder(ran, "old lanes"))
    upkeep.remove("gone")
    upkeep.remove("never added")
    upkeep.add("lanes", 1, recorder(ran, "new lanes"))
    assert upkeep.run_due("x") == ["lanes"]
    assert ran == ["new lanes:x"]
    assert upkeep.get("gone") is None


def test_a_task_removed_by_an_earlier_one_in_the_same_call_does_not_run(clock: Clock) -> None:
    ran: list[str] = []
    upkeep: Scheduler[str] = Scheduler(clock=clock)
    upkeep.add("first", 1, lambda _context: upkeep.remove("second"))
    upkeep.add("second", 1, recorder(ran, "second"))
    assert upkeep.run_due("x") == ["first"]
    assert ran == []


@pytest.mark.parametrize(("interval", "delay"), [(0, 0), (-1, 0), (float("nan"), 0), (1, -1)])
def test_bad_interval_or_delay(clock: Clock, interval: float, delay: float) -> None:
    with pytest.raises(ConfigurationError, match="interval > 0 and delay >= 0"):
        Scheduler[str](clock=clock).add("t", interval, lambda _context: None, delay=delay)
