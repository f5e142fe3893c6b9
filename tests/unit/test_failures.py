"""Failure handling with fakes: dead letters, missing ids, outages, ambiguous commits."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinbox.app import App
from kinbox.apply import narrow
from kinbox.apply.envelope import event_id
from kinbox.apply.narrow import CONFLICT_RETRIES
from kinbox.consume.runner import Runner
from kinbox.core.config import DEFAULT_ID_HEADERS, Settings
from kinbox.core.errors import DeadLetter, EnvelopeError, Retry, TransportError
from kinbox.core.event import Event
from kinbox.core.letter import REPLAY_HEADER
from kinbox.core.record import Record
from kinbox.middleware.base import Middleware
from kinbox.testing import FakePublisher, FakeStore, FakeTransport, InlineExecutor, record

pytestmark = pytest.mark.unit

T = "orders"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Harness:
    """A runner over fakes; its batches run inside each turn unless ``threads``."""

    def __init__(self, app: App, *, threads: bool = False, **settings: Any) -> None:
        self.transport = FakeTransport()
        self.store = FakeStore()
        self.publisher = FakePublisher()
        self.clock = Clock()
        config = Settings(database_url="postgresql:///x", group_id="g", **settings).validate()
        self.runner = Runner(
            app, config, self.transport, self.store, clock=self.clock, publisher=self.publisher,
            executor=None if threads else InlineExecutor(),
        )  # fmt: skip
        self.subscribed = False

    def add(self, *records: Any) -> None:
        for r in records:
            self.transport.append(r)

    def run(self, turns: int = 1, advance: float = 120.0) -> None:
        if not self.subscribed:  # the fake assigns the partitions that have records
            self.transport.subscribe([T], self.runner)
            self.subscribed = True
        for _ in range(turns):
            self.runner.turn()
            self.clock.now += advance

    @property
    def committed(self) -> int | None:
        return self.transport.committed.get((T, 0))


def effect_app(fail: Any = None, **route: Any) -> App:
    """Applies ``event.id`` as an effect; ``fail(event)`` may raise first."""
    app = App(group_id="g")

    @app.handler(T, **route)
    def apply(event: Event, tx: Any) -> None:
        if fail is not None:
            fail(event)
        tx.effects.append(event.id)

    return app


def always(exc: BaseException) -> Any:
    def fail(event: Event) -> None:
        if event.id.startswith("bad"):
            raise exc

    return fail


def test_failing_handler_is_dead_lettered_after_max_attempts_and_the_batch_moves_on() -> None:
    h = Harness(effect_app(always(RuntimeError("no such customer"))), max_attempts=3)
    h.add(record(T, 0, 0, "a"), record(T, 0, 1, "bad-1"), record(T, 0, 2, "c"))
    h.run(turns=2)
    assert h.committed == 1 and h.publisher.acked == []  # two tries so far, held at bad-1
    h.run()
    # Then the third try dead-letters it, and c is applied in the same transaction
    assert h.store.effects == ["a", "c"]
    assert h.committed == 3
    assert h.store.status == {"a": "applied", "bad-1": "dead_lettered", "c": "applied"}
    assert "handler-error: RuntimeError: no such customer" in h.store.reasons["bad-1"]
    [letter] = h.publisher.acked
    assert letter.topic == f"{T}.dlq"
    assert letter.value == b"{}" and ("event-id", b"bad-1") in letter.headers
    headers = h.publisher.headers(0)
    assert headers["kinbox.dlq.topic"] == T
    assert (headers["kinbox.dlq.partition"], headers["kinbox.dlq.offset"]) == ("0", "1")
    assert headers["kinbox.dlq.consumer"] == "g"
    assert headers["kinbox.dlq.reason"] == "handler-error"
    assert headers["kinbox.dlq.error.type"] == "RuntimeError"
    assert headers["kinbox.dlq.error.message"] == "no such customer"
    assert headers["kinbox.dlq.attempts"] == "3"
    assert headers["kinbox.dlq.time"].endswith("+00:00")


def test_per_handler_max_attempts_and_dead_letter_topic() -> None:
    app = effect_app(always(ValueError("x")), max_attempts=1, dead_letter_topic="poison")
    h = Harness(app, max_attempts=50)
    h.add(record(T, 0, 0, "bad"))
    h.run()
    assert [r.topic for r in h.publisher.acked] == ["poison"]
    assert h.committed == 1


def test_dead_letter_raised_by_the_handler_skips_the_retries() -> None:
    h = Harness(effect_app(always(DeadLetter("unknown currency XTS"))))
    h.add(record(T, 0, 0, "bad"), record(T, 0, 1, "b"))
    h.run()
    assert (
        h.publisher.headers(0)["kinbox.dlq.reason"] == "dead-letter-requested: unknown currency XTS"
    )
    assert h.publisher.headers(0)["kinbox.dlq.attempts"] == "1"
    assert h.store.effects == ["b"] and h.committed == 2


def test_undecodable_payload_is_a_handler_failure_that_ends_in_the_dead_letter_topic() -> None:
    def decode(event: Event) -> None:
        event.json()

    h = Harness(effect_app(decode), max_attempts=2)
    h.add(record(T, 0, 0, "ok"), record(T, 0, 1, "garbled", value=b"\xff{not json"))
    h.run(turns=2)
    assert h.store.effects == ["ok"]
    assert h.publisher.headers(0)["kinbox.dlq.error.type"] == "UnicodeDecodeError"
    assert h.publisher.acked[0].value == b"\xff{not json"
    assert h.committed == 2


def test_retry_counts_as_an_attempt_and_is_dead_lettered_when_exhausted() -> None:
    tries: list[int] = []

    def later(event: Event) -> None:
        tries.append(event.attempt)
        raise Retry(delay=7)

    h = Harness(effect_app(later), max_attempts=3)
    h.add(record(T, 0, 0, "a"))
    h.run(advance=7.01)  # waits exactly the delay the handler asked for
    h.run(advance=7.01)
    assert tries == [1, 2] and h.publisher.acked == []
    h.run()
    assert tries == [1, 2, 3]
    assert h.publisher.headers(0)["kinbox.dlq.reason"] == "retries-exhausted"
    assert h.committed == 1


def test_dead_letter_is_acknowledged_before_the_db_commit_and_the_offset() -> None:
    h = Harness(effect_app(always(DeadLetter("no"))))
    h.add(record(T, 0, 0, "a"), record(T, 0, 1, "bad"))
    h.publisher.fail_flushes = 2  # the broker is unreachable for two tries
    h.run()
    # Then the event before it commits, but nothing is recorded as dead-lettered
    # and the offset holds at the dead letter's record
    assert h.store.status == {"a": "applied"} and h.committed == 1
    assert (T, 0) in h.transport.paused
    h.run(turns=2)
    assert h.store.status == {"a": "applied", "bad": "dead_lettered"}
    assert h.committed == 2
    assert len(h.publisher.acked) == 1


def test_a_redelivered_dead_letter_is_not_sent_twice_and_a_replay_applies_it_once() -> None:
    broken = [True]

    def fail(event: Event) -> None:
        if broken[0]:
            raise DeadLetter("bug")

    h = Harness(effect_app(fail))
    h.add(record(T, 0, 0, "e1"))
    h.run()
    assert h.store.status == {"e1": "dead_lettered"}
    # When the same record is delivered again (a rewind): a duplicate, no second dead letter
    h.add(record(T, 0, 1, "e1"))
    h.run()
    assert len(h.publisher.acked) == 1 and h.store.effects == []
    # When the handler is fixed and the dead letter replayed (twice)
    broken[0] = False
    replayed = [("event-id", b"e1"), (REPLAY_HEADER, b"orders.dlq/0/0")]
    h.add(record(T, 0, 2, "e1", headers=replayed), record(T, 0, 3, "e1", headers=replayed))
    h.run()
    # Then it is applied exactly once
    assert h.store.effects == ["e1"]
    assert h.store.status == {"e1": "applied"}
    assert h.committed == 4


def test_replay_header_does_not_reapply_an_applied_event() -> None:
    h = Harness(effect_app())
    h.add(record(T, 0, 0, "e1"))
    h.add(record(T, 0, 1, "e1", headers=[("event-id", b"e1"), (REPLAY_HEADER, b"x/0/0")]))
    h.run()
    assert h.store.effects == ["e1"]


def test_missing_id_is_dead_lettered_and_recorded_under_a_derived_key() -> None:
    h = Harness(effect_app())
    h.add(record(T, 0, 0, "a"), record(T, 0, 1, None), record(T, 0, 2, "c"))
    h.run()
    assert h.store.effects == ["a", "c"]
    assert h.store.status[f"{T}/0/1"] == "dead_lettered"
    assert h.store.reasons[f"{T}/0/1"].startswith("invalid-id: EnvelopeError: no event id header")
    headers = h.publisher.headers(0)
    assert (headers["kinbox.dlq.reason"], headers["kinbox.dlq.attempts"]) == ("invalid-id", "0")
    assert h.committed == 3
    # A redelivery of the same record is recognised by its position: no second dead letter
    h.transport.seek((T, 0), 0)
    h.run()
    assert len(h.publisher.acked) == 1 and h.store.effects == ["a", "c"]


def test_missing_id_derive_applies_once_per_position() -> None:
    h = Harness(effect_app(), missing_id="derive")
    h.add(record(T, 0, 0, None))
    h.run()
    h.transport.seek((T, 0), 0)  # consumer redelivery: suppressed
    h.run()
    assert h.store.effects == [f"{T}/0/0"]
    assert h.publisher.acked == []


def test_transient_database_error_inside_a_handler_never_counts_towards_dead_lettering() -> None:
    outage = [3]
    app = App(group_id="g")

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        if outage[0]:
            outage[0] -= 1
            tx.lose(psycopg.OperationalError("server closed the connection unexpectedly"))
        tx.effects.append(event.id)

    h = Harness(app, max_attempts=1)
    h.add(record(T, 0, 0, "a"))
    h.run(turns=4)
    assert h.publisher.acked == []
    assert h.store.effects == ["a"] and h.committed == 1


def test_database_outage_pauses_keeps_polling_and_resumes() -> None:
    h = Harness(effect_app(), max_attempts=1)
    h.add(record(T, 0, 0, "a"), record(T, 0, 1, "b"))
    h.store.fail_claims = 5
    polls = 0
    real_poll = h.transport.poll

    def counting_poll(max_messages: int, timeout: float) -> list[Record]:
        nonlocal polls
        polls += 1
        return real_poll(max_messages, timeout)

    h.transport.poll = counting_poll  # type: ignore[method-assign]
    h.run(turns=0)
    for _ in range(10):
        h.runner.turn()  # no time passes: backing off, but still polling
    assert polls == 10 and h.committed is None and (T, 0) in h.transport.paused
    h.run(turns=8)
    assert h.store.effects == ["a", "b"] and h.committed == 2
    assert h.publisher.acked == []  # an outage is never a reason to dead-letter


def test_backoff_grows_with_consecutive_outages() -> None:
    h = Harness(effect_app(), retry_initial=1.0, retry_max=100.0)
    h.add(record(T, 0, 0, "a"))
    h.store.fail_claims = 4
    delays = []
    h.run(turns=0)
    for _ in range(4):
        h.runner.turn()
        delays.append(h.runner._flow.backoff.until[(T, 0)] - h.clock.now)
        h.clock.now += 1000
    assert delays[0] < 2 < 4 < delays[3]


def test_kafka_outage_commits_once_the_broker_is_back() -> None:
    h = Harness(effect_app())
    h.add(record(T, 0, 0, "a"))
    h.transport.commit_errors.extend(
        TransportError("broker down", retriable=True) for _ in range(5)
    )
    h.run(turns=3)
    assert h.committed is None and h.store.effects == ["a"]
    h.run(turns=3)
    assert h.committed == 1 and h.store.effects == ["a"]


def test_ambiguous_commit_is_resolved_by_rereading_processed_events() -> None:
    # Given a COMMIT that reached the server but whose reply was lost
    h = Harness(effect_app())
    h.add(record(T, 0, 0, "a"), record(T, 0, 1, "b"))
    h.store.lose_after_commit = 1
    h.run()
    # Then kinbox does not guess: no offset, the partition retried from its first record
    assert h.committed is None and h.store.effects == ["a", "b"]
    h.run()
    # And the retry's claim finds both ids recorded: no handler runs again
    assert h.store.effects == ["a", "b"]
    assert h.committed == 2


def test_ambiguous_commit_that_did_not_commit_is_applied_on_retry() -> None:
    h = Harness(effect_app())
    h.add(record(T, 0, 0, "a"))
    h.store.fail_claims = 1  # the transaction never got through
    h.run(turns=2)
    assert h.store.effects == ["a"] and h.committed == 1


def test_batch_handler_isolates_the_poison_event_on_its_last_try() -> None:
    app = App(group_id="g")

    @app.handler(T, batch=True, max_attempts=2)
    def many(events: list[Event], tx: Any) -> None:
        for event in events:
            if event.id == "bad":
                raise ValueError("poison")
            tx.effects.append(event.id)

    h = Harness(app)
    h.add(*(record(T, 0, o, i) for o, i in enumerate(["a", "bad", "c"])))
    h.run(turns=2)
    assert h.store.effects == ["a", "c"]
    assert h.store.status["bad"] == "dead_lettered"
    assert h.committed == 3


def test_dead_letter_headers_keep_the_original_ones_and_truncate_the_message() -> None:
    h = Harness(effect_app(always(RuntimeError("é" * 2000))), max_attempts=1)
    original = [("event-id", b"bad"), ("trace", b"t1"), ("trace", None)]
    h.add(record(T, 0, 0, "bad", value=json.dumps({"k": 1}).encode(), headers=original))
    h.run()
    letter = h.publisher.acked[0]
    assert letter.headers[:3] == original
    message = h.publisher.headers(0)["kinbox.dlq.error.message"]
    assert len(message.encode()) <= 1000 and message.endswith("...")


_id_value = st.one_of(
    st.just(b""),
    st.binary(min_size=1, max_size=8),  # often not UTF-8
    st.text(min_size=1, max_size=12).map(str.encode),
    st.integers(256, 400).map(lambda n: b"x" * n),  # oversize
)
_header = st.tuples(st.sampled_from(["event-id", "ce_id", "id", "other"]), st.none() | _id_value)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_header, max_size=4), min_size=1, max_size=12))
def test_arbitrary_id_headers_never_crash_the_loop_and_nothing_is_lost(
    headers: list[list[tuple[str, bytes | None]]],
) -> None:
    h = Harness(effect_app())
    for offset, hs in enumerate(headers):
        h.add(record(T, 0, offset, None, headers=hs))
    h.run(turns=3)
    # Then each record ends applied (first of its id), suppressed (a repeat) or dead-lettered
    expected_applied: list[str] = []
    expected_dead: list[int] = []
    for r in h.transport.logs[(T, 0)]:
        try:
            eid = event_id(r, DEFAULT_ID_HEADERS)
        except EnvelopeError:
            expected_dead.append(r.offset)
            continue
        if eid not in expected_applied:
            expected_applied.append(eid)
    dead = [int(h.publisher.headers(i)["kinbox.dlq.offset"]) for i in range(len(h.publisher.acked))]
    assert h.store.effects == expected_applied
    assert dead == expected_dead
    assert all(h.store.status[f"{T}/0/{o}"] == "dead_lettered" for o in dead)
    # And the offset has moved past all of them
    assert h.committed == len(headers)


class Slow(Middleware):
    """Holds a batch whose first record is ``slow*`` before its transaction, until released.

    Outside the transaction, so the fake store (one transaction at a time) lets
    the other partitions' batches through meanwhile, as PostgreSQL would.
    """

    def __init__(self) -> None:
        self.release = threading.Event()
        self.holding = threading.Event()

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        if records[0].value == b"slow":
            self.holding.set()
            assert self.release.wait(10), "the polling thread stopped polling"


class SlowHarness(Harness):
    """Batches on worker threads; a ``slow`` batch waits until the loop polled ``polls`` times."""

    def __init__(self, polls: int, on_poll: Any = None) -> None:
        self.polls = 0
        self.slow = Slow()
        app = App(group_id="g", middleware=[self.slow])

        @app.handler(T)
        def apply(event: Event, tx: Any) -> None:
            tx.effects.append(event.id)

        super().__init__(app, threads=True, shutdown_timeout=10)
        real_poll = self.transport.poll

        def poll(max_messages: int, timeout: float) -> list[Record]:
            self.polls += 1
            if self.polls >= polls:
                self.slow.release.set()
            if on_poll is not None:
                on_poll(self)
            return real_poll(max_messages, timeout)

        self.transport.poll = poll  # type: ignore[method-assign]

    def run_until_idle(self, timeout: float = 10.0) -> None:
        """Turn until no batch is in flight and nothing is waiting (at least one turn)."""
        deadline = time.monotonic() + timeout
        self.run()
        while len(self.runner._inflight) or any(True for _ in self.runner._flow.lanes.ready()):
            assert time.monotonic() < deadline, "the batches never ended"
            self.run(advance=0)


def slow(topic: str, partition: int, offset: int, event_id: str) -> Record:
    return record(topic, partition, offset, event_id, value=b"slow")


def test_a_slow_batch_holds_only_its_partition_and_the_loop_keeps_polling() -> None:
    # Given a batch on partition 0 that takes a long time, and a record on partition 1
    h = SlowHarness(polls=8)
    h.add(slow(T, 0, 0, "slow-1"), record(T, 0, 1, "b"), record(T, 1, 0, "c"))
    seen: list[tuple[int, list[str], dict[Any, int]]] = []

    def watch(harness: SlowHarness) -> None:
        seen.append((harness.polls, list(harness.store.effects), dict(harness.transport.committed)))

    h.run()  # both batches start
    while h.polls < 7:
        h.run(advance=0)
        watch(h)
    # Then the loop polled on while it ran (the member stays in the group), and
    # partition 1 was applied and committed meanwhile, before the slow batch ended
    assert any(effects == ["c"] and committed == {(T, 1): 1} for _, effects, committed in seen)
    h.run_until_idle()
    assert sorted(h.store.effects) == ["b", "c", "slow-1"]
    assert h.transport.committed == {(T, 0): 2, (T, 1): 1}
    assert h.transport.paused == set()


def test_revoke_during_a_slow_batch_waits_for_it_and_commits_its_offsets() -> None:
    def revoke_on_third_poll(h: SlowHarness) -> None:
        if h.polls == 3:
            h.transport.revoke([(T, 0)])

    h = SlowHarness(polls=3, on_poll=revoke_on_third_poll)
    h.add(slow(T, 0, 0, "slow-1"), record(T, 0, 1, "b"))
    h.run_until_idle()
    # Then the revoke waited for the batch and committed its offsets before letting go
    assert h.polls >= 3
    assert h.transport.committed == {(T, 0): 2}
    assert h.store.effects == ["slow-1", "b"]
    assert (T, 0) not in h.transport.assigned
    calls = len(h.transport.commit_calls)
    h.run_until_idle()
    assert len(h.transport.commit_calls) == calls  # nothing committed for it afterwards


def test_partition_assigned_during_a_slow_batch_is_applied_meanwhile() -> None:
    def assign_on_second_poll(h: SlowHarness) -> None:
        if h.polls == 2:
            h.transport.append(record(T, 1, 0, "late-1"))
            h.transport.append(record(T, 1, 1, "late-2"))
            h.transport.assign([(T, 1)])

    h = SlowHarness(polls=6, on_poll=assign_on_second_poll)
    h.add(slow(T, 0, 0, "slow-1"))
    while h.polls < 5:
        h.run(advance=0)
    # The new partition's records went by the slow batch
    assert h.store.effects == ["late-1", "late-2"] and h.transport.committed == {(T, 1): 2}
    h.run_until_idle()
    assert sorted(h.store.effects) == ["late-1", "late-2", "slow-1"]
    assert h.transport.committed == {(T, 0): 1, (T, 1): 2}


def test_a_conflict_is_redone_at_once_a_bounded_number_of_times_then_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a handler that meets a deadlock for "stuck" every time, and for
    # "flaky" as many times as one batch redoes conflicts (after the
    # pipelined pass's), then not
    monkeypatch.setattr(narrow, "CONFLICT_PAUSE", 0.0)
    calls: Counter[str] = Counter()
    app = App(group_id="g")

    @app.handler(T, max_attempts=2)
    def apply(event: Event, tx: Any) -> None:
        calls[event.id] += 1
        flaky = event.id == "flaky" and calls["flaky"] <= 1 + CONFLICT_RETRIES
        if flaky or event.id == "stuck":
            tx.fail(psycopg.errors.DeadlockDetected("deadlock detected"))
        tx.effects.append(event.id)

    h = Harness(app, max_attempts=2)
    h.add(record(T, 0, 0, "flaky"), record(T, 0, 1, "stuck"), record(T, 0, 2, "c"))
    # When the worker runs one batch
    h.run(turns=1)
    # Then "flaky" committed on its first try, its conflicts no tries; the
    # partition stopped at "stuck", whose conflicts past the bound counted one
    assert h.store.effects == ["flaky"] and h.committed == 1 and h.publisher.acked == []
    # When it runs on
    h.run(turns=3)
    # Then "stuck" is dead-lettered on its second try, and the partition moved on
    assert h.store.effects == ["flaky", "c"] and h.committed == 3
    [letter] = h.publisher.acked
    headers = h.publisher.headers(0)
    assert (headers["kinbox.dlq.reason"], headers["kinbox.dlq.attempts"]) == ("handler-error", "2")
    assert "DeadlockDetected" in headers["kinbox.dlq.error.message"]
    assert letter.value == b"{}"
    # Bounded: its first try met the bound's conflicts and one that counted;
    # its second, a pipelined call too (its batch began with it this time)
    assert calls["stuck"] == (CONFLICT_RETRIES + 1) + (1 + CONFLICT_RETRIES + 1)
