"""The skim (kinbox.apply.skim) over the fakes: known duplicates dropped before any transaction.

What a skim may change is only how much work a duplicate costs: every
test checks the same effects, results and offsets a run without a skim
gives, and what the skim saved (transactions, claims).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.apply.skim import RUN_BATCHES, worth_skimming
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import DeadLetter, Retry
from kinbox.core.event import Event
from kinbox.core.letter import REPLAY_HEADER
from kinbox.core.outcome import BatchResult, Step
from kinbox.core.record import Record
from kinbox.middleware.base import Middleware
from kinbox.testing import FakePublisher, FakeStore, FakeTransport, InlineExecutor, record
from tests.unit.test_breaker import Held

pytestmark = pytest.mark.unit

T = "lessons"


def effect_app(*, batch: bool = False, bad: Sequence[str] = (), letter: Sequence[str] = ()) -> App:
    """Appends each fresh event's id; ids in ``bad`` raise Retry, in ``letter`` DeadLetter."""
    app = App(group_id="g")

    def one(event: Event, tx: Any) -> None:
        if event.id in bad:
            raise Retry(0.0, "not yet")
        if event.id in letter:
            raise DeadLetter("unusable")
        tx.effects.append(event.id)

    if batch:

        @app.handler(T, batch=True)
        def many(events: list[Event], tx: Any) -> None:
            for event in events:
                one(event, tx)

    else:
        app.handler(T)(one)
    return app


class Steps(Middleware):
    """Notes every batch's records and every claim step."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.claims: list[Step] = []

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        self.batches.append([r.offset for r in records])

    def after_step(self, step: Step) -> None:
        if step.name == "claim":
            self.claims.append(step)


def processor(app: App, store: FakeStore, batch_size: int | None = None) -> BatchProcessor:
    return BatchProcessor(
        app.routes, store, ["event-id"], publisher=FakePublisher(), consumer="g",
        middleware=app.middleware, batch_size=batch_size,
    )  # fmt: skip


def records(ids: Sequence[str | None], start: int = 0) -> list[Record]:
    return [record(T, 0, start + i, event_id) for i, event_id in enumerate(ids)]


def applied_once(app: App, store: FakeStore, ids: Sequence[str]) -> None:
    """Apply ``ids`` in an earlier batch, so the store holds them as processed."""
    result = processor(app, store).process(records(ids, start=1000))
    assert result.applied == len(set(ids))


def test_a_run_of_known_events_opens_no_transaction() -> None:
    app, store = effect_app(), FakeStore()
    applied_once(app, store, ["a", "b", "c"])
    before = store.transactions

    result = processor(app, store).process(records(["a", "b", "c", "a"]), skim=True)

    assert result == BatchResult(next_offset=4, duplicates=4)
    assert store.transactions == before and store.effects == ["a", "b", "c"]
    assert store.skims == [["a", "b", "c"]]


@pytest.mark.parametrize("batch", [False, True], ids=["per-event", "batch"])
def test_a_run_applies_what_is_left_batch_by_batch_in_offset_order(batch: bool) -> None:
    app, store = effect_app(batch=batch), FakeStore()
    app.add_middleware(steps := Steps())
    applied_once(app, store, ["k1", "k2", "k3"])
    claims_before = len(store.claims)
    ids = ["k1", "f1", "k2", "k3", "f2", "f3", "k1", "f4"]

    result = processor(app, store, batch_size=3).process(records(ids), skim=True)

    assert store.effects[3:] == ["f1", "f2", "f3", "f4"]
    assert (result.next_offset, result.applied, result.duplicates) == (8, 4, 4)
    # Each batch of the run is a batch of its own, and claims only what is left.
    assert steps.batches[-3:] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert store.claims[claims_before:] == [["f1"], ["f2", "f3"], ["f4"]]


def test_a_failure_in_a_later_batch_of_a_run_stops_the_run_there() -> None:
    app, store = effect_app(bad=["bad"]), FakeStore()
    applied_once(app, store, ["k1", "k2", "k3"])

    result = processor(app, store, batch_size=2).process(
        records(["k1", "f1", "k2", "bad", "f2", "k3"]), skim=True
    )

    assert result.failure is not None and result.failure.offset == 3
    # Everything before the failed event is settled (k2, known, included), nothing after it.
    assert (result.next_offset, result.applied, result.duplicates) == (3, 1, 2)
    assert store.effects[3:] == ["f1"]


def test_a_first_try_failing_at_the_head_of_a_run_commits_nothing() -> None:
    app, store = effect_app(bad=["bad"]), FakeStore()

    result = processor(app, store, batch_size=2).process(records(["bad", "f1"]), skim=True)

    assert result.next_offset is None and result.failure is not None
    assert result.failure.offset == 0 and store.effects == []


def test_a_replayed_record_is_never_skimmed_so_its_dead_lettered_row_is_taken_over() -> None:
    app, store = effect_app(letter=["x"]), FakeStore()
    applied_once(app, store, ["k"])
    processor(app, store).process([record(T, 0, 500, "x")])
    assert store.status["x"] == "dead_lettered"
    replayed = record(T, 0, 1, None, headers=[("event-id", b"x"), (REPLAY_HEADER, b"1")])
    fixed = effect_app()  # the handler is fixed before the replay

    result = processor(fixed, store).process([record(T, 0, 0, "k"), replayed], skim=True)

    assert store.skims[-1] == ["k"]
    assert (result.applied, result.duplicates) == (1, 1)
    assert store.status["x"] == "applied" and store.effects == ["k", "x"]


def test_a_skim_leaves_an_id_reused_with_another_payload_to_the_claim_which_reports_it() -> None:
    # Given a, b and c applied, then a run with a and c again as they were, b
    # with another payload, and c twice, the second time with another payload
    app, store = effect_app(), FakeStore()
    applied_once(app, store, ["a", "b", "c"])
    again = [*records(["a", "b", "c"]), record(T, 0, 3, "c", value=b'{"other": 1}')]
    again[1] = record(T, 0, 1, "b", value=b'{"other": 2}')

    result = processor(app, store).process(again, skim=True)

    # Then a and b are looked up (c, with two payloads, is left to the claim),
    # a alone is skimmed; b and c go to the claim, which drops them as
    # duplicates and reports the two reuses
    assert store.skims[-1] == ["a", "b"]
    assert (result.applied, result.duplicates, result.reused) == (0, 4, 2)
    assert sorted(s.event.offset for s in store.sightings.values()) == [1, 3]
    assert store.effects == ["a", "b", "c"]


@pytest.mark.parametrize("knob", ["fail_skims", "refuse_id"])
def test_a_failed_look_up_skims_nothing_and_the_claims_decide(knob: str) -> None:
    app, store = effect_app(), FakeStore()
    applied_once(app, store, ["k1", "k2"])
    if knob == "fail_skims":
        store.fail_skims = 1
    else:
        store.refuse_id = lambda event_id: event_id == "odd"
    transactions = store.transactions

    result = processor(app, store, batch_size=2).process(
        records(["k1", "f1", "k2", "odd"]), skim=True
    )

    assert store.transactions > transactions  # every batch claimed, as without a skim
    if knob == "fail_skims":
        assert (result.next_offset, result.applied, result.duplicates) == (4, 2, 2)
        assert store.effects[2:] == ["f1", "odd"]
    else:
        # The refused id is pinned on its record by the claim, as always.
        assert result.next_offset == 4 and result.dead_lettered == 1


def test_missing_id_fail_stops_a_run_at_the_record_it_would_stop_a_batch_at() -> None:
    app, store = effect_app(), FakeStore()
    applied_once(app, store, ["k1", "k2"])
    skimmer = BatchProcessor(
        app.routes, store, ["event-id"], consumer="g", missing_id="fail", batch_size=2
    )

    result = skimmer.process(records(["k1", "f1", "k2", None, "f2"]), skim=True)

    assert result.failure is not None and result.failure.kind == "envelope"
    assert result.failure.offset == 3
    assert (result.next_offset, result.applied, result.duplicates) == (3, 1, 2)
    assert store.effects[2:] == ["f1"]


def test_skimmed_duplicates_are_reported_as_a_claim_of_their_batch() -> None:
    app, store = effect_app(), FakeStore()
    applied_once(app, store, ["k1"])
    app.add_middleware(steps := Steps())

    processor(app, store).process(records(["k1", "f1"]), skim=True)

    skimmed, claimed = steps.claims
    assert [e.id for e in skimmed.events] == ["k1", "f1"]
    assert [e.id for e in skimmed.fresh or ()] == ["f1"]
    assert [e.id for e in claimed.events] == ["f1"] == [e.id for e in claimed.fresh or ()]


@pytest.mark.parametrize(
    ("result", "worth"),
    [
        (BatchResult(10, duplicates=10), True),
        (BatchResult(40, duplicates=40), True),
        (BatchResult(10, duplicates=9), False),  # a short batch says little of what comes next
        (BatchResult(10, applied=1, duplicates=9), False),
        (BatchResult(10, duplicates=9, dead_lettered=1), False),
    ],
)
def test_a_whole_batch_of_duplicates_and_nothing_else_is_worth_skimming_after(
    result: BatchResult, worth: bool
) -> None:
    assert worth_skimming(result, 10) is worth


def test_the_runner_skims_a_partition_after_a_whole_batch_of_duplicates_until_a_fresh_one() -> None:
    transport, executor, clock = FakeTransport(), Held(), [0.0]
    app, store = effect_app(), FakeStore()
    config = Settings(database_url="postgresql:///x", group_id="g", batch_max_messages=2)
    runner = Runner(
        app, config.validate(), transport, store, executor=executor, clock=lambda: clock[0]
    )
    # two fresh; a whole batch of duplicates; a run of four batches, a fresh
    # one among them; then fresh batches again
    run = ["a", "b", "a", "b", "b", "c", "a", "b"]
    assert len(run) == 2 * RUN_BATCHES
    ids = ["a", "b", "a", "b", *run, "d", "e", "f", "g"]
    for offset, event_id in enumerate(ids):
        transport.append(record(T, 0, offset, event_id))
    transport.subscribe(app.topics, runner)

    for turn in range(60):
        runner.turn()
        clock[0] += 1.0
        if turn % 8 == 7:  # the batch in flight ends once the lane holds a few more
            executor.release()

    assert transport.committed[(T, 0)] == len(ids)
    assert store.effects == ["a", "b", "c", "d", "e", "f", "g"]
    assert store.skims == [["a", "b", "c"]]  # one look-up for the whole run
    assert store.claims[2:] == [["c"], ["d", "e"], ["f", "g"]]


def test_a_partition_given_back_and_assigned_again_does_not_skim_at_first() -> None:
    transport = FakeTransport()
    app, store = effect_app(), FakeStore()
    config = Settings(database_url="postgresql:///x", group_id="g", batch_max_messages=2)
    runner = Runner(app, config.validate(), transport, store, executor=InlineExecutor())
    for offset, event_id in enumerate(["a", "b", "a", "b", "c", "d"]):
        transport.append(record(T, 0, offset, event_id))
    transport.subscribe(app.topics, runner)
    runner.turn()
    runner.turn()  # [a b] applied, then [a b]: a whole batch of duplicates
    assert store.skims == []
    transport.revoke([(T, 0)])
    transport.assign([(T, 0)])

    for _ in range(5):
        runner.turn()

    assert store.skims == [] and store.effects == ["a", "b", "c", "d"]
