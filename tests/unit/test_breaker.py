"""The circuit breaker, alone and inside the runner, on the fakes of kinbox.testing."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import pytest

from kinbox.app import App
from kinbox.consume.breaker import Breaker, State
from kinbox.consume.pauses import PauseLedger, Reason
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import ConfigurationError, DeadLetter, StoreError
from kinbox.core.event import Event
from kinbox.core.letter import HANDLER_ERROR, INVALID_ID, REQUESTED, Letter
from kinbox.core.outcome import BatchResult, Failure
from kinbox.core.transport import Partition
from kinbox.testing import FakePublisher, FakeStore, FakeTransport, InlineExecutor, record

pytestmark = pytest.mark.unit

T = "orders"
P0, P1, P2 = (T, 0), (T, 1), (T, 2)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def state(brk: Breaker) -> State:
    """Read afresh each time (mypy would narrow the attribute across the calls between)."""
    return brk.state


def handler_failed(partition: int, offset: int, attempt: int = 1) -> BatchResult:
    """A batch that stopped at an event whose handler raised."""
    event = Event(f"e{partition}-{offset}", T, partition, offset, None, b"{}", attempt=attempt)
    failure = Failure(T, partition, offset, attempt, RuntimeError("bad deploy"), event=event)
    return BatchResult(None, failure)


def dead_lettered(partition: int, offset: int, reason: str) -> BatchResult:
    letter = Letter(record(T, partition, offset, "x"), f"{T}.dlq", "g", reason, ValueError("no"), 5)
    return BatchResult(offset + 1, dead_lettered=1, letters=(letter,))


def breaker(
    failures: int = 3, pause: float = 10.0, assigned: tuple[Partition, ...] = (P0, P1, P2)
) -> tuple[Breaker, FakeTransport, Clock, PauseLedger]:
    transport = FakeTransport({tp: [] for tp in (P0, P1, P2)})
    clock, pauses = Clock(), PauseLedger(transport)
    pauses.assign(assigned)
    return Breaker(transport, pauses, failures, pause, clock), transport, clock, pauses


def test_distinct_failed_events_in_a_row_open_it_and_pause_every_partition() -> None:
    brk, transport, _, pauses = breaker(failures=3)
    pauses.want(Reason.BACKOFF, [P0, P1])
    brk.observe(handler_failed(0, 5))
    brk.observe(handler_failed(0, 5, attempt=2))  # the same event again: still one
    brk.observe(handler_failed(1, 0))
    assert state(brk) is State.CLOSED
    brk.gate()
    assert brk.held == set()
    brk.observe(dead_lettered(2, 7, HANDLER_ERROR))  # tries ran out: counts
    assert state(brk) is State.OPEN
    # Open: every partition is held, so a backoff letting go resumes none
    brk.gate()
    assert transport.paused == {P0, P1, P2}
    assert brk.held == {P0, P1, P2}
    pauses.release(Reason.BACKOFF)
    assert transport.paused == {P0, P1, P2}


def test_an_applied_event_starts_the_count_again() -> None:
    brk, _, _, _ = breaker(failures=3)
    brk.observe(handler_failed(0, 1))
    brk.observe(handler_failed(1, 1))
    brk.observe(BatchResult(10, applied=4))
    brk.observe(handler_failed(2, 1))
    brk.observe(handler_failed(2, 2))
    assert state(brk) is State.CLOSED
    brk.observe(handler_failed(0, 2))
    assert state(brk) is State.OPEN


def test_poison_events_among_applied_ones_never_open_it() -> None:
    # Given batches that each apply most events and dead-letter a few poison
    # ones whose tries ran out (as fault scenario 16's stream does)
    brk, _, _, _ = breaker(failures=3)
    for partition in (0, 1, 2) * 4:
        poison = (1, 3, 5, 7)  # more than `failures` in one batch, none in a row
        letters = tuple(
            Letter(record(T, partition, o, "x"), f"{T}.dlq", "g", HANDLER_ERROR, ValueError(), 1)
            for o in poison
        )
        brk.observe(BatchResult(10, applied=6, dead_lettered=4, letters=letters))
    # Then no run of failures formed: the stream keeps flowing
    assert state(brk) is State.CLOSED


@pytest.mark.parametrize(
    "result",
    [
        dead_lettered(0, 1, INVALID_ID),
        dead_lettered(0, 1, f"{REQUESTED}: refused on purpose"),
        BatchResult(None, Failure(T, 0, 1, 1, StoreError("down", transient=True))),
        BatchResult(5, duplicates=5),
    ],
    ids=["invalid-id", "dead-letter-requested", "outage", "duplicates"],
)
def test_what_is_no_failure_of_the_handler_never_counts(result: BatchResult) -> None:
    brk, _, _, _ = breaker(failures=1)
    for _ in range(3):
        brk.observe(result)
    assert state(brk) is State.CLOSED


def test_half_open_lets_one_event_through_and_puts_the_rest_back() -> None:
    brk, transport, clock, _ = breaker(failures=1, pause=10)
    brk.observe(handler_failed(0, 0))
    brk.gate()
    clock.now = 9.9
    brk.gate()
    assert state(brk) is State.OPEN
    assert brk.admit({P1: [record(T, 1, 3, "a")]}) == {}  # fetched before the pause
    assert transport.position[P1] == 3  # rewound to it
    clock.now = 10.0
    brk.gate()
    assert state(brk) is State.HALF_OPEN
    assert transport.paused == set()  # resumed, to find a probe wherever records are
    batches = {
        P1: [record(T, 1, 3, "a"), record(T, 1, 4, "b")],
        P2: [record(T, 2, 8, "c")],
    }
    taken = brk.admit(batches)
    assert {tp: [r.offset for r in rs] for tp, rs in taken.items()} == {P1: [3]}
    # The others are rewound to their first record not taken, and paused
    assert transport.paused == {P1, P2}
    assert brk.held == {P1, P2}
    assert brk.admit({P0: [record(T, 0, 0, "d")]}) == {}  # one probe at a time


def test_a_probe_applied_closes_it_and_resumes_what_it_paused() -> None:
    brk, transport, clock, pauses = breaker(failures=1, pause=5)
    pauses.want(Reason.BACKOFF, [P0])
    brk.observe(handler_failed(0, 0))
    brk.gate()
    clock.now = 5
    brk.gate()
    brk.admit({P1: [record(T, 1, 0, "a"), record(T, 1, 1, "b")]})
    brk.observe(BatchResult(1, applied=1))
    assert state(brk) is State.CLOSED
    # The backing-off partition is left to its backoff, the rest resume
    brk.gate()
    assert transport.paused == {P0}
    assert brk.held == set()


def test_a_probe_that_fails_opens_it_again_for_another_pause() -> None:
    brk, _, clock, _ = breaker(failures=1, pause=5, assigned=(P0,))
    brk.observe(handler_failed(0, 0))
    clock.now = 5
    brk.gate()
    brk.admit({P0: [record(T, 0, 0, "a")]})
    brk.observe(handler_failed(0, 0, attempt=2))
    assert state(brk) is State.OPEN
    clock.now = 9.9
    brk.gate()
    assert state(brk) is State.OPEN
    clock.now = 10
    brk.gate()
    assert state(brk) is State.HALF_OPEN


def test_a_probe_without_a_verdict_lets_the_next_poll_probe_again() -> None:
    brk, _, clock, _ = breaker(failures=1, pause=5, assigned=(P0, P1))
    brk.observe(handler_failed(0, 0))
    clock.now = 5
    brk.gate()
    assert brk.admit({P0: [record(T, 0, 0, "a")]})
    brk.observe(BatchResult(1, duplicates=1))  # a duplicate says nothing about the handler
    assert state(brk) is State.HALF_OPEN
    brk.gate()
    assert brk.admit({P1: [record(T, 1, 0, "b")]})
    brk.forget(P1)  # the probe's partition went while it ran: never judged
    brk.gate()
    assert brk.admit({P0: [record(T, 0, 1, "c")]})


def test_zero_failures_never_opens() -> None:
    brk, _, _, _ = breaker(failures=0)
    for offset in range(100):
        brk.observe(handler_failed(0, offset))
    assert state(brk) is State.CLOSED


def test_settings_validate_the_breaker() -> None:
    base: dict[str, Any] = {"database_url": "postgresql:///x", "group_id": "g"}
    assert Settings(**base).breaker_failures == 10
    assert Settings(**base).breaker_pause == 30.0
    with pytest.raises(ConfigurationError, match="breaker_failures"):
        Settings(**base, breaker_failures=-1).validate()
    with pytest.raises(ConfigurationError, match="breaker_pause"):
        Settings(**base, breaker_pause=0).validate()
    loaded = Settings.load(
        {}, {"KINBOX_BREAKER_FAILURES": "4", "KINBOX_BREAKER_PAUSE": "2.5"}, Settings(**base)
    )
    assert (loaded.breaker_failures, loaded.breaker_pause) == (4, 2.5)


# -- inside the runner --


def failing_app(broken: list[bool], applied: list[str]) -> App:
    app = App(group_id="g")

    @app.handler(T, max_attempts=2)
    def apply(event: Event, tx: Any) -> None:
        if event.id == "requested":
            raise DeadLetter("not for us")
        if broken[0]:
            raise RuntimeError("bad deploy: every event fails")
        tx.effects.append(event.id)
        applied.append(event.id)

    return app


def runner_with(
    transport: FakeTransport, app: App, **settings: Any
) -> tuple[Runner, FakeStore, FakePublisher, Clock]:
    store, publisher, clock = FakeStore(), FakePublisher(), Clock()
    config = Settings(
        database_url="postgresql:///x", group_id="g", retry_initial=0.1, retry_max=0.1, **settings
    ).validate()
    runner = Runner(
        app, config, transport, store, clock=clock, publisher=publisher, executor=InlineExecutor()
    )
    transport.subscribe(app.topics, runner)
    return runner, store, publisher, clock


def turns(runner: Runner, clock: Clock, seconds: float, step: float = 0.05) -> None:
    end = clock.now + seconds
    while clock.now < end:
        runner.turn()
        clock.now += step


def test_a_bad_deploy_dead_letters_a_few_events_then_drains_exactly_once_when_fixed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kinbox.consume.breaker")
    logs: dict[Partition, list[Any]] = {tp: [] for tp in (P0, P1, P2)}
    transport = FakeTransport(logs)
    for offset in range(40):
        for p in range(3):
            transport.append(record(T, p, offset, f"e{p}-{offset}"))
    broken, applied = [True], list[str]()
    runner, store, publisher, clock = runner_with(
        transport, failing_app(broken, applied), breaker_failures=4, breaker_pause=30
    )
    # Given a handler that fails for every event, for ten minutes
    turns(runner, clock, 600)
    # Then only a few events were given up: the breaker paused the member
    letters = len(publisher.acked)
    assert 1 <= letters <= 4 + 600 // 30, letters
    assert not applied
    assert "circuit breaker open: the handler failed for 4 events in a row" in caplog.text
    assert transport.paused == {P0, P1, P2}
    # When the handler is fixed, the next probe closes it and everything drains once
    broken[0] = False
    turns(runner, clock, 60)
    assert "circuit breaker closed" in caplog.text
    dead = {i for i, s in store.status.items() if s == "dead_lettered"}
    assert len(dead) == letters
    every = sorted(f"e{p}-{o}" for p in range(3) for o in range(40))
    assert sorted(applied + sorted(dead)) == every
    assert len(applied) == len(set(applied))
    assert transport.committed == {tp: 40 for tp in (P0, P1, P2)}
    assert transport.paused == set()


def test_deliberate_dead_letters_never_open_it() -> None:
    transport = FakeTransport()
    for offset in range(20):
        event_id = f"requested-{offset}" if offset % 2 else f"e{offset}"
        transport.append(record(T, 0, offset, event_id))
    transport.append(record(T, 0, 20, "requested-too"))
    app = App(group_id="g")

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        if event.id.startswith("requested"):
            raise DeadLetter("not for us")
        tx.effects.append(event.id)

    runner, _, publisher, clock = runner_with(transport, app, breaker_failures=1)
    turns(runner, clock, 2)
    assert len(publisher.acked) == 11
    assert transport.committed == {P0: 21}


class Held(Executor):
    """Holds each job until :meth:`release` (or runs it at once once ``inline``)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[[], Any], Future[Any]]] = []
        self.submitted = 0
        self.inline = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.submitted += 1
        future: Future[Any] = Future()
        self.jobs.append((lambda: fn(*args, **kwargs), future))
        if self.inline:
            self.release()
        return future

    def release(self) -> None:
        jobs, self.jobs = self.jobs, []
        for job, future in jobs:
            future.set_result(job())


def test_records_waiting_in_a_lane_when_it_opens_are_put_back_not_tried() -> None:
    # Given two partitions whose first batches are in flight while more of
    # their records wait in the lanes, and a handler that fails for every event
    transport = FakeTransport({P0: [], P1: []})
    for offset in range(12):
        for p in (0, 1):
            transport.append(record(T, p, offset, f"e{p}-{offset}"))
    broken, applied = [True], list[str]()
    app = App(group_id="g")

    @app.handler(T, max_attempts=1)
    def apply(event: Event, tx: Any) -> None:
        if broken[0]:
            raise RuntimeError("bad deploy: every event fails")
        tx.effects.append(event.id)
        applied.append(event.id)

    store, publisher, clock, executor = FakeStore(), FakePublisher(), Clock(), Held()
    config = Settings(
        database_url="postgresql:///x", group_id="g", breaker_failures=1, breaker_pause=30,
        batch_max_messages=2, retry_initial=0.1, retry_max=0.1,
    ).validate()  # fmt: skip
    runner = Runner(
        app, config, transport, store, clock=clock, publisher=publisher, executor=executor
    )
    transport.subscribe(app.topics, runner)
    for _ in range(10):
        runner.turn()
    assert executor.submitted == 2
    assert runner._flow.lanes.waiting(P0) > 0 and runner._flow.lanes.waiting(P1) > 0
    # When the batches end, their first events dead-lettered: the breaker opens
    executor.release()
    turns(runner, clock, 20)
    assert state(runner._flow.breaker) is State.OPEN
    # Then nothing that waited in a lane was started meanwhile; it was put back
    assert executor.submitted == 2
    assert transport.paused == {P0, P1}
    # And once the handler works again every event ends applied or
    # dead-lettered exactly once, the offsets at the end
    broken[0] = False
    executor.inline = True
    turns(runner, clock, 60)
    dead = {i for i, s in store.status.items() if s == "dead_lettered"}
    assert sorted(applied + sorted(dead)) == sorted(f"e{p}-{o}" for p in (0, 1) for o in range(12))
    assert len(applied) == len(set(applied))
    assert transport.committed == {P0: 12, P1: 12}


class Gated(Executor):
    """Holds each job until :meth:`run` releases it by its submission number."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[[], Any], Future[Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.jobs.append((lambda: fn(*args, **kwargs), future))
        return future

    def run(self, number: int) -> None:
        job, future = self.jobs[number]
        future.set_result(job())


def test_a_full_lane_stays_paused_when_the_breaker_lets_its_partition_go(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="kinbox.consume.breaker")
    # Given P0's batch in flight for long, its lane filled to the cap (so
    # P0 is paused for its lane), and a handler that fails for P1's events
    transport = FakeTransport({P0: [], P1: []})
    for offset in range(400):
        transport.append(record(T, 0, offset, f"e0-{offset}"))
    for offset in range(4):
        transport.append(record(T, 1, offset, f"e1-{offset}"))
    app = App(group_id="g")

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        if event.partition == 1:
            raise RuntimeError("bad deploy: every event fails")
        tx.effects.append(event.id)

    clock, executor = Clock(), Gated()
    config = Settings(
        database_url="postgresql:///x", group_id="g", breaker_failures=1, breaker_pause=5,
        batch_max_messages=2, retry_initial=0.1, retry_max=0.1,
    ).validate()  # fmt: skip
    runner = Runner(app, config, transport, FakeStore(), clock=clock, executor=executor)
    transport.subscribe(app.topics, runner)
    lanes = runner._flow.lanes
    while len(executor.jobs) < 2:
        runner.turn()
    assert lanes.waiting(P0) >= lanes.cap and P0 in transport.paused
    # When P1's batch fails, the breaker opens (pausing every partition) and,
    # its pause over, goes half-open and resumes what it paused
    executor.run(1)
    for _ in range(200):
        runner.turn()
        clock.now += 0.1
        # Then P0's lane never grows past a poll beyond its cap: P0 stays
        # paused for its lane, whatever the breaker wants of it
        assert lanes.waiting(P0) <= lanes.cap + config.batch_max_messages
        assert P0 in transport.paused
    assert "circuit breaker half-open" in caplog.text  # it did want P0 resumed
