"""Dead letters go out between two transactions (kinbox.apply.batch, kinbox.apply.narrow).

The transaction that finds dead letters rolls back; they are flushed with no
transaction open; the batch is applied again with their verdicts fixed, and
that transaction records them and commits. Checked over the fakes: no
transaction is open at any flush; the dead-lettered events' handlers do not
run once their letters went out; a batch without dead letters still takes
one transaction and no flush; a redo that meets a new failure handles it as
any failure and ends; and a crash at each point of the sequence (a failpoint
that raises) loses nothing and applies nothing twice — at most the dead
letter goes out twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from kinbox.app import App
from kinbox.apply.batch import BatchProcessor
from kinbox.core import failpoints
from kinbox.core.errors import DeadLetter
from kinbox.core.event import Event
from kinbox.core.failpoints import FailpointError
from kinbox.core.record import Record
from kinbox.testing import FakePublisher, FakeStore, record
from kinbox.testing.store import FakeTransaction

pytestmark = pytest.mark.unit

T = "orders"


class WatchedStore(FakeStore):
    """A :class:`FakeStore` that knows how many of its transactions are open."""

    def __init__(self) -> None:
        super().__init__()
        self.open = 0

    @contextmanager
    def transaction(self) -> Iterator[FakeTransaction]:
        with super().transaction() as tx:
            self.open += 1
            try:
                yield tx
            finally:
                self.open -= 1


class WatchingPublisher(FakePublisher):
    """Notes, each time it is served (acknowledgements awaited), how many transactions are open."""

    def __init__(self, store: WatchedStore) -> None:
        super().__init__()
        self.store = store
        self.open_at_wait: list[int] = []

    def serve(self, timeout: float) -> None:
        self.open_at_wait.append(self.store.open)
        super().serve(timeout)

    def letters(self) -> list[str]:
        """The event ids of the acknowledged dead letters, in order."""
        return [(dict(r.headers)["event-id"] or b"").decode() for r in self.acked]


class Bench:
    """A batch processor over the fakes, and every handler call, with the flushes before it."""

    def __init__(self, fail: Callable[[Event, int], None], *, batch: bool = False) -> None:
        self.store = WatchedStore()
        self.publisher = WatchingPublisher(self.store)
        self.calls: list[tuple[str, int]] = []
        """``(event id, flushes before the call)`` of every handler call."""
        self.app = App(group_id="g")

        def one(event: Event, tx: Any) -> None:
            self.calls.append((event.id, len(self.publisher.open_at_wait)))
            fail(event, sum(1 for i, _ in self.calls if i == event.id))
            tx.effects.append(event.id)

        if batch:

            @self.app.handler(T, batch=True)
            def many(events: list[Event], tx: Any) -> None:
                for event in events:
                    one(event, tx)

        else:
            self.app.handler(T)(one)

    def processor(self) -> BatchProcessor:
        """A fresh processor over the same store and broker (a restarted worker's)."""
        return BatchProcessor(
            self.app.routes, self.store, ["event-id"], publisher=self.publisher, consumer="g"
        )

    def called_after_flush(self, event_id: str, flushes: int = 1) -> int:
        """Calls of ``event_id``'s handler after the first ``flushes`` flushes."""
        return sum(1 for i, seen in self.calls if i == event_id and seen >= flushes)


def records(ids: Sequence[str | None]) -> list[Record]:
    return [record(T, 0, offset, event_id) for offset, event_id in enumerate(ids)]


def given_up(*ids: str) -> Callable[[Event, int], None]:
    """Events ``ids`` are given up on every call (``DeadLetter``)."""

    def fail(event: Event, call: int) -> None:
        if event.id in ids:
            raise DeadLetter("unusable")

    return fail


@pytest.fixture
def disarm() -> Iterator[None]:
    yield
    failpoints.configure(None)


@pytest.mark.parametrize("batch", [False, True], ids=["per-event", "batch"])
def test_dead_letters_are_flushed_with_no_transaction_open_then_recorded_by_a_redo(
    batch: bool,
) -> None:
    bench = Bench(given_up("bad"), batch=batch)

    result = bench.processor().process(records(["a", "bad", "c"]))

    # The broker acknowledged the dead letter while no transaction was open
    assert bench.publisher.open_at_wait == [0]
    assert bench.publisher.letters() == ["bad"]
    # ... and the transaction after it recorded it and committed the rest
    assert (result.next_offset, result.applied, result.dead_lettered) == (3, 2, 1)
    assert bench.store.status == {"a": "applied", "bad": "dead_lettered", "c": "applied"}
    assert sorted(bench.store.effects) == ["a", "c"]
    # ... its verdict fixed: the handler of the dead-lettered event did not run again
    assert bench.called_after_flush("bad") == 0
    assert bench.called_after_flush("a") == 1


def test_a_batch_without_dead_letters_takes_one_transaction_and_no_flush() -> None:
    bench = Bench(given_up())

    result = bench.processor().process(records(["a", "b", "c"]))

    assert (result.next_offset, result.applied) == (3, 3)
    assert (bench.store.transactions, bench.store.commits) == (1, 1)
    assert bench.publisher.open_at_wait == []


def test_dead_letters_found_only_in_the_careful_pass_go_out_in_one_flush() -> None:
    # p1 abandons the optimistic pass; the careful pass meets p2 as well
    bench = Bench(given_up("p1", "p2"))

    result = bench.processor().process(records(["p1", "a", "p2", "b"]))

    assert bench.publisher.open_at_wait == [0]
    assert bench.publisher.letters() == ["p1", "p2"]
    assert bench.store.status == {
        "p1": "dead_lettered", "a": "applied", "p2": "dead_lettered", "b": "applied",
    }  # fmt: skip
    assert (result.next_offset, result.applied, result.dead_lettered) == (4, 2, 2)
    # Optimistic, careful (rolled back for the dead letters), then the redo
    assert (bench.store.transactions, bench.store.commits) == (3, 1)
    assert bench.called_after_flush("p1") == bench.called_after_flush("p2") == 0
    assert Counter(i for i, _ in bench.calls)["p2"] == 1


def test_a_record_without_an_id_costs_its_batch_one_redo() -> None:
    bench = Bench(given_up())

    result = bench.processor().process(records(["a", None, "c"]))

    assert bench.publisher.open_at_wait == [0] and len(bench.publisher.acked) == 1
    assert (result.next_offset, result.applied, result.dead_lettered) == (3, 2, 1)
    assert (bench.store.transactions, bench.store.commits) == (2, 1)
    assert sorted(bench.store.effects) == ["a", "c"]


def test_a_dead_letter_the_broker_does_not_take_holds_the_partition_at_it() -> None:
    bench = Bench(given_up("bad"))
    bench.publisher.fail_flushes = 1

    result = bench.processor().process(records(["a", "bad", "c"]))

    # Then the event before it commits, and the partition waits at it: no try counted
    assert bench.publisher.open_at_wait == [0] and bench.publisher.acked == []
    assert result.next_offset == 1 and result.failure is not None
    assert (result.failure.offset, result.failure.dead_letter_topic) == (1, f"{T}.dlq")
    assert bench.store.status == {"a": "applied"}


def test_a_new_failure_in_the_redo_is_the_event_s_failed_try() -> None:
    # "flaky" fails only in the redo, after the dead letter of "bad" went out
    def fail(event: Event, call: int) -> None:
        if event.id == "bad":
            raise DeadLetter("unusable")
        if event.id == "flaky" and call == 3:
            raise RuntimeError("flaky")

    bench = Bench(fail)

    result = bench.processor().process(records(["a", "flaky", "bad"]))

    # Then the partition stops at it with one try counted, the event before it committed
    assert result.next_offset == 1 and result.failure is not None
    assert (result.failure.offset, result.failure.attempt) == (1, 1)
    assert bench.store.status == {"a": "applied"}
    # ... the dead letter went out but is not recorded; the next try sends it
    # again (at-least-once), records it once, and applies nothing twice
    result = bench.processor().process(records(["a", "flaky", "bad"])[1:], attempt=2)
    assert result.next_offset == 3 and result.failure is None
    assert bench.store.status == {"a": "applied", "flaky": "applied", "bad": "dead_lettered"}
    assert Counter(bench.store.effects) == {"a": 1, "flaky": 1}
    assert bench.publisher.letters() == ["bad", "bad"]
    assert set(bench.publisher.open_at_wait) == {0}


def test_a_new_dead_letter_in_the_redo_goes_out_in_another_round() -> None:
    # "late" is given up only when its handler runs after the first flush:
    # its second call (the optimistic pass stops at "bad" before it)
    def fail(event: Event, call: int) -> None:
        if event.id == "bad" or (event.id == "late" and call == 2):
            raise DeadLetter("unusable")

    bench = Bench(fail)

    result = bench.processor().process(records(["bad", "a", "late"]))

    assert bench.publisher.open_at_wait == [0, 0]
    assert bench.publisher.letters() == ["bad", "late"]
    assert (result.next_offset, result.applied, result.dead_lettered) == (3, 1, 2)
    assert bench.store.status == {"bad": "dead_lettered", "a": "applied", "late": "dead_lettered"}
    assert bench.called_after_flush("late", flushes=2) == 0


@pytest.mark.parametrize(
    ("point", "copies"),
    [("after_dead_letter_ack", 2), ("before_db_commit", 2), ("after_db_commit", 1)],
)
@pytest.mark.usefixtures("disarm")
def test_a_crash_at_any_point_loses_nothing_and_applies_nothing_twice(
    point: str, copies: int
) -> None:
    bench = Bench(given_up("bad"))
    batch = records(["a", "bad", "c"])
    failpoints.configure(f"{point}=raise")

    # Given a worker that dies at the point
    with pytest.raises(FailpointError):
        bench.processor().process(batch)
    committed = point == "after_db_commit"
    assert bool(bench.store.status) == committed
    assert bench.publisher.letters() == ["bad"]  # acknowledged before any COMMIT records it

    # When a restarted worker meets the same records (its offset was never committed)
    failpoints.configure(None)
    result = bench.processor().process(batch)

    # Then each event ends applied or dead-lettered once; the dead letter is on
    # the topic once, or twice when the crash came between its ack and the COMMIT
    assert bench.store.status == {"a": "applied", "bad": "dead_lettered", "c": "applied"}
    assert Counter(bench.store.effects) == {"a": 1, "c": 1}
    assert result.next_offset == 3
    assert bench.publisher.letters() == ["bad"] * copies
    assert set(bench.publisher.open_at_wait) == {0}
