from __future__ import annotations

import threading
from typing import Any

import pytest

from kinbox.app import App
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import Retry, TransportError
from kinbox.core.event import Event
from kinbox.testing import FakeStore, FakeTransport, InlineExecutor, record

pytestmark = pytest.mark.unit

T = "lessons"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(
    app: App, transport: FakeTransport, store: FakeStore | None = None, **settings: Any
) -> tuple[Runner, FakeStore, Clock]:
    store = store or FakeStore()
    clock = Clock()
    config = Settings(database_url="postgresql:///x", group_id="g", **settings).validate()
    runner = Runner(app, config, transport, store, clock=clock, executor=InlineExecutor())
    transport.subscribe(app.topics, runner)
    return runner, store, clock


def recording_app(log: list[Any]) -> App:
    app = App(group_id="g")

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        tx.effects.append((event.id, event.partition, event.offset))
        log.append(event)

    return app


def test_same_event_three_times_has_one_effect_and_offsets_follow_the_db() -> None:
    transport = FakeTransport()
    for offset in range(3):
        transport.append(record(T, 0, offset, "evt-1"))
    seen: list[Event] = []
    runner, store, _ = make(recording_app(seen), transport)

    runner.turn()

    assert store.effects == [("evt-1", 0, 0)]
    assert [e.offset for e in seen] == [0]
    assert transport.committed == {(T, 0): 3}


def test_redelivery_in_a_later_batch_is_suppressed() -> None:
    transport = FakeTransport()
    transport.append(record(T, 0, 0, "a"))
    seen: list[Event] = []
    runner, store, _ = make(recording_app(seen), transport)
    runner.turn()
    transport.append(record(T, 0, 1, "a"))
    transport.append(record(T, 0, 2, "b"))
    runner.turn()
    assert [effect[0] for effect in store.effects] == ["a", "b"]
    assert transport.committed == {(T, 0): 3}


def test_order_is_kept_per_partition() -> None:
    transport = FakeTransport()
    for p in range(3):
        for o in range(20):
            transport.append(record(T, p, o, f"{p}-{o}"))
    seen: list[Event] = []
    runner, _, _ = make(recording_app(seen), transport, batch_max_messages=7)
    for _ in range(20):
        runner.turn()
    for p in range(3):
        offsets = [e.offset for e in seen if e.partition == p]
        assert offsets == list(range(20))
    assert transport.committed == {(T, p): 20 for p in range(3)}


def test_handler_failure_rolls_back_holds_the_offset_and_retries_after_backoff() -> None:
    transport = FakeTransport()
    for o in range(3):
        transport.append(record(T, 0, o, f"e{o}"))
    app = App(group_id="g")
    calls: list[tuple[str, int]] = []

    @app.handler(T)
    def flaky(event: Event, tx: Any) -> None:
        calls.append((event.id, event.attempt))
        tx.effects.append(event.id)
        if event.id == "e1" and event.attempt < 3:
            raise RuntimeError("boom")

    runner, store, clock = make(app, transport)

    runner.turn()  # fails at e1: its work rolled back, e0 committed, the partition stops at e1
    assert store.effects == ["e0"]
    assert set(store.claimed) == {"e0"}
    assert transport.committed == {(T, 0): 1}
    assert (T, 0) in transport.paused

    runner.turn()  # still backing off: the partition stays paused, nothing happens
    assert store.effects == ["e0"]

    clock.now += 60
    runner.turn()  # attempt 2 fails again
    assert transport.committed == {(T, 0): 1}
    clock.now += 60
    runner.turn()  # attempt 3 succeeds
    assert store.effects == ["e0", "e1", "e2"]
    assert transport.committed == {(T, 0): 3}
    # e0 ran twice (its first try was rolled back with e1's), then e1 counted its own tries
    assert calls == [("e0", 1), ("e1", 1), ("e0", 1), ("e1", 2), ("e1", 3), ("e2", 1)]


def test_handler_can_ask_for_its_own_retry_delay() -> None:
    transport = FakeTransport()
    transport.append(record(T, 0, 0, "a"))
    app = App(group_id="g")
    attempts: list[int] = []

    @app.handler(T)
    def later(event: Event, tx: Any) -> None:
        attempts.append(event.attempt)
        if event.attempt == 1:
            raise Retry(delay=5)

    runner, _, clock = make(app, transport)
    runner.turn()
    clock.now += 4.9
    runner.turn()
    assert attempts == [1]
    clock.now += 0.2
    runner.turn()
    assert attempts == [1, 2]
    assert transport.committed == {(T, 0): 1}


def test_transient_store_error_is_retried_without_committing() -> None:
    transport = FakeTransport()
    transport.append(record(T, 0, 0, "a"))
    store = FakeStore()
    store.fail_claims = 1
    runner, _, clock = make(recording_app([]), transport, store)
    runner.turn()
    assert transport.committed == {}
    clock.now += 60
    runner.turn()
    assert store.effects == [("a", 0, 0)]
    assert transport.committed == {(T, 0): 1}


def test_other_partitions_keep_flowing_while_one_backs_off() -> None:
    transport = FakeTransport()
    transport.append(record(T, 0, 0, "bad"))
    transport.append(record(T, 1, 0, "good"))
    app = App(group_id="g")

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        if event.id == "bad":
            raise ValueError("no")
        tx.effects.append(event.id)

    runner, store, _ = make(app, transport)
    runner.turn()
    assert store.effects == ["good"]
    assert transport.committed == {(T, 1): 1}


def test_missing_id_fail_commits_the_events_before_it_and_stops_the_worker() -> None:
    from kinbox.core.errors import EnvelopeError

    transport = FakeTransport()
    transport.append(record(T, 0, 0, "a"))
    transport.append(record(T, 0, 1, None))
    transport.append(record(T, 0, 2, "c"))
    runner, store, _ = make(recording_app([]), transport, missing_id="fail")
    with pytest.raises(EnvelopeError, match=r"missing_id=fail: no event id header.*lessons\[0\]@1"):
        runner.turn()
    runner._offsets.commit()  # what run()'s finally does on the way out
    assert store.effects == [("a", 0, 0)]
    assert transport.committed == {(T, 0): 1}  # not past the bad record


def test_batch_handler_gets_fresh_events_of_one_partition_in_order() -> None:
    transport = FakeTransport()
    for o, eid in enumerate(["a", "b", "a", "c"]):
        transport.append(record(T, 0, o, eid))
    app = App(group_id="g")
    batches: list[list[str]] = []

    @app.handler(T, batch=True)
    def many(events: list[Event], tx: Any) -> None:
        batches.append([e.id for e in events])

    runner, _, _ = make(app, transport)
    runner.turn()
    transport.append(record(T, 0, 4, "b"))
    runner.turn()
    assert batches == [["a", "b", "c"]]
    assert transport.committed == {(T, 0): 5}


def test_revoke_commits_what_the_db_committed_and_lost_commits_nothing() -> None:
    transport = FakeTransport()
    transport.append(record(T, 0, 0, "a"))
    transport.append(record(T, 1, 0, "b"))
    runner, _, _ = make(recording_app([]), transport)
    # Given offsets committed in the DB but whose Kafka commit failed (retriable)
    transport.commit_errors.append(TransportError("coordinator moving", retriable=True))
    runner.turn()
    assert transport.committed == {}
    # When partition 0 is revoked and partition 1 is lost
    transport.revoke([(T, 0)])
    transport.revoke([(T, 1)], lost=True)
    # Then only the revoked one is committed, and nothing is retried afterwards
    assert transport.committed == {(T, 0): 1}
    calls = len(transport.commit_calls)
    runner.turn()
    assert len(transport.commit_calls) == calls


def test_rejected_commit_is_kept_while_the_partition_stays_assigned() -> None:
    # Given a commit rejected mid-rebalance (ILLEGAL_GENERATION) for a partition kept
    transport = FakeTransport()
    transport.append(record(T, 0, 0, "a"))
    runner, _, _ = make(recording_app([]), transport)
    transport.commit_errors.append(TransportError("ILLEGAL_GENERATION", retriable=False))
    runner.turn()
    assert transport.committed == {}
    # When the next turn comes, the offset is committed after all
    runner.turn()
    assert transport.committed == {(T, 0): 1}


def test_rejected_commit_is_not_retried_after_the_partition_is_lost() -> None:
    transport = FakeTransport()
    transport.append(record(T, 0, 0, "a"))
    runner, _, _ = make(recording_app([]), transport)
    transport.commit_errors.append(TransportError("UNKNOWN_MEMBER_ID", retriable=False))
    runner.turn()
    transport.revoke([(T, 0)], lost=True)
    calls = len(transport.commit_calls)
    runner.turn()
    assert transport.committed == {} and len(transport.commit_calls) == calls


def test_retriable_commit_failure_is_retried_next_turn() -> None:
    transport = FakeTransport()
    transport.append(record(T, 0, 0, "a"))
    runner, _, _ = make(recording_app([]), transport)
    transport.commit_errors.append(TransportError("timed out", retriable=True))
    runner.turn()
    runner.turn()
    assert transport.committed == {(T, 0): 1}


def test_run_stops_commits_and_closes() -> None:
    transport = FakeTransport()
    transport.append(record(T, 0, 0, "a"))
    store = FakeStore()
    app = App(group_id="g")
    config = Settings(database_url="postgresql:///x", group_id="g").validate()
    holder: list[Runner] = []
    runner = Runner(app_with_stop(app, lambda: holder[0].stop()), config, transport, store)
    holder.append(runner)
    runner.run()
    assert transport.committed == {(T, 0): 1}
    assert transport.closed and store.closed


def app_with_stop(app: App, stop: Any) -> App:
    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        stop()  # a signal arriving mid-batch: the batch in hand still completes

    return app


def test_runner_without_handlers_is_a_configuration_error() -> None:
    from kinbox.core.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="no handlers"):
        Runner(App(group_id="g"), Settings(), FakeTransport(), FakeStore())


def _both_first_batches_in_flight(
    second_partition: int, **runner_args: Any
) -> tuple[Runner, FakeTransport, threading.Event]:
    """A runner whose batches (of one record) on partitions 0 and 1 are both running, blocked.

    Partition 0 has three records, partition 1 ``second_partition``; all are
    fetched (a record a poll). Set the event to let the handlers return.
    """
    release = threading.Event()
    app = App(group_id="g")

    @app.handler(T)
    def slow(event: Event, tx: Any) -> None:
        release.wait(10)

    transport = FakeTransport()
    for offset in range(3):
        transport.append(record(T, 0, offset, f"0-{offset}"))
    for offset in range(second_partition):
        transport.append(record(T, 1, offset, f"1-{offset}"))
    config = Settings(database_url="postgresql:///x", group_id="g", batch_max_messages=1)
    runner = Runner(app, config.validate(), transport, FakeStore(), **runner_args)
    transport.subscribe(app.topics, runner)
    try:
        for _ in range(8):
            runner.turn()
        assert len(runner._inflight) == 2
    except BaseException:
        release.set()
        raise
    return runner, transport, release


def _spy_waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record each bound the loop waits for a batch with (and do not wait)."""
    from kinbox.consume.inflight import InFlight

    waits: list[float] = []
    real_wait = InFlight.wait

    def spy(self: InFlight, timeout: float) -> None:
        waits.append(timeout)
        real_wait(self, 0)

    monkeypatch.setattr(InFlight, "wait", spy)
    return waits


@pytest.mark.parametrize(("second_partition", "expected"), [(3, "saturated"), (1, "busy")])
def test_polling_backs_off_only_while_every_partition_has_its_next_batch_waiting(
    monkeypatch: pytest.MonkeyPatch, second_partition: int, expected: str
) -> None:
    """A record fetched while every partition has records waiting could only queue.

    So the loop sleeps until a batch ends (SATURATED_WAIT at most) instead of
    polling every BUSY_WAIT; a partition with nothing waiting keeps the short
    bound, so its next record is fetched at once.
    """
    from kinbox.consume import runner as runner_module

    runner, _, release = _both_first_batches_in_flight(second_partition)
    try:
        waits = _spy_waits(monkeypatch)
        runner.turn()
    finally:
        release.set()
    bound = {"saturated": runner_module.SATURATED_WAIT, "busy": runner_module.BUSY_WAIT}
    assert waits == [bound[expected]]
    runner.stop()


def test_no_poll_while_every_partition_has_a_whole_batch_waiting_but_one_at_least_every_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A poll then could only queue more records behind whole batches.

    Its consume() gives the GIL to the batch threads and waits to get it back,
    so the loop only waits for a batch to end; it still polls once
    SATURATED_WAIT has passed since the last poll, for the rebalances, errors
    and commit answers only a poll serves.
    """
    from kinbox.consume import runner as runner_module

    now = [100.0]
    runner, transport, release = _both_first_batches_in_flight(3, clock=lambda: now[0])
    polls: list[float] = []
    real_poll = transport.poll

    def spy_poll(most: int, timeout: float) -> list[Any]:
        polls.append(timeout)
        return real_poll(most, timeout)

    try:
        monkeypatch.setattr(transport, "poll", spy_poll)
        waits = _spy_waits(monkeypatch)
        runner.turn()
        assert (polls, waits) == ([], [runner_module.SATURATED_WAIT])
        now[0] += runner_module.SATURATED_WAIT / 2
        runner.turn()
        assert polls == []
        now[0] += runner_module.SATURATED_WAIT / 2
        runner.turn()
        assert polls == [0.0]  # a poll that does not wait: batches are in flight
    finally:
        release.set()
    runner.stop()
