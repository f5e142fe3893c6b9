"""A rebalance served inside a poll never commits an offset past a record not settled.

librdkafka serves rebalance callbacks inside its calls, and a poll makes two
of them (:meth:`kinbox.kafka.consumer.KafkaTransport.poll`): a revoke served
by the second meets a partition whose position is past the record the first
returned, before the runner has seen that record. The fake transport runs
its ``inside_poll`` callables at exactly that point. Every commit here is
audited against invariant 2 (:class:`tests.support.engine.Audited`).
"""

from __future__ import annotations

import itertools
from concurrent.futures import Executor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinbox.app import App
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import TransportError
from kinbox.core.event import Event
from kinbox.testing import FakeStore, InlineExecutor
from tests.support.engine import Audited, ManualExecutor, event

pytestmark = pytest.mark.unit

T = "orders"
P0, P1 = (T, 0), (T, 1)


def applying_app() -> App:
    app = App(group_id="g")

    @app.handler(T)
    def apply(event: Event, tx: Any) -> None:
        tx.effects.append(event.id)

    return app


def make(transport: Audited, executor: Executor | None = None, **config: Any) -> Runner:
    ticks = itertools.count()
    runner = Runner(
        applying_app(),
        Settings(database_url="postgresql:///x", group_id="g", **config).validate(),
        transport,
        transport.store,
        # A clock that moves on: the loop never skips a poll for a recent one.
        clock=lambda: float(next(ticks)),
        executor=executor or InlineExecutor(),
    )
    transport.subscribe([T], runner)
    return runner


def idle_member(records: int = 3) -> tuple[Audited, Runner]:
    """A member that applied and committed ``records`` of P0: settled up to its position."""
    transport = Audited({P0: [event(P0, o) for o in range(records)]}, FakeStore())
    runner = make(transport)
    runner.turn()
    assert transport.committed == {P0: records}
    return transport, runner


def test_a_revoke_between_a_polls_two_calls_commits_nothing_past_what_the_first_returned() -> None:
    # Given a partition whose every record so far is applied and committed
    transport, runner = idle_member(3)
    transport.append(event(P0, 3))
    transport.append(event(P0, 4))
    # When the group revokes it inside the next poll, after its first call returned offset 3
    transport.inside_poll.append(lambda: transport.revoke([P0]))
    runner.turn()
    # Then the revoke commits nothing past offset 3, which no transaction settled ...
    assert transport.committed == {P0: 3}
    assert transport.violations == []
    assert transport.store.effects == ["0-0", "0-1", "0-2"]
    # ... and its next owner (this member again, later) reads the record from there
    transport.assign([P0])
    runner.turn()
    assert transport.store.effects == ["0-0", "0-1", "0-2", "0-3", "0-4"]
    assert transport.committed == {P0: 5}


def test_a_revoke_and_reassign_inside_one_poll_drop_the_first_calls_records() -> None:
    # Given an idle partition and two more records
    transport, runner = idle_member(3)
    transport.append(event(P0, 3))
    transport.append(event(P0, 4))
    # When the group revokes it and gives it back inside one poll (an eager
    # rebalance: revoke everything, then assign)
    transport.inside_poll.append(lambda: transport.revoke([P0]))
    transport.inside_poll.append(lambda: transport.assign([P0]))
    runner.turn()
    # Then nothing was committed past what was settled, and the new
    # assignment applies each record once, in order, from the committed offset
    assert transport.violations == []
    assert transport.store.effects == ["0-0", "0-1", "0-2", "0-3", "0-4"]
    assert transport.committed == {P0: 5}


def test_a_partition_given_back_inside_the_poll_starts_over_from_its_committed_offset() -> None:
    # Given one batch at a time (P0's, in flight) and P1's offsets 0-1 waiting behind it
    logs = {P0: [event(P0, 0), event(P0, 1)], P1: [event(P1, o) for o in range(4)]}
    transport = Audited(logs, FakeStore())
    executor = ManualExecutor()
    runner = make(transport, executor, batch_max_messages=2, pool_size=1)
    runner.turn()
    runner.turn()
    assert len(executor.jobs) == 1 and transport.position[P1] == 2
    # When the group revokes P1 and gives it back inside the next poll, after
    # its first call returned P1's offset 2
    transport.inside_poll.append(lambda: transport.revoke([P1]))
    transport.inside_poll.append(lambda: transport.assign([P1]))
    runner.turn()
    # Then the new assignment reads P1 from its committed offset (none: 0),
    # and offset 2 of the old assignment is not applied ahead of 0 and 1
    for _ in range(10):
        executor.run_all()
        runner.turn()
    assert transport.store.effects == ["0-0", "0-1", "1-0", "1-1", "1-2", "1-3"]
    assert transport.committed == {P0: 2, P1: 4}
    assert transport.violations == []


def test_a_poll_that_fails_after_its_first_call_leaves_no_position_for_the_shutdown() -> None:
    # Given an idle partition, and a poll whose second client call fails after
    # the first returned offset 3 (its records never reach the runner)
    transport, runner = idle_member(3)
    transport.append(event(P0, 3))

    def fails() -> None:
        raise TransportError("consuming: the client gave up", retriable=True)

    transport.inside_poll.append(fails)
    # When the failure ends the worker: the shutdown commits, then close() revokes
    with pytest.raises(TransportError, match="gave up"):
        runner.run()
    # Then neither commit passed the record the runner never saw
    assert transport.closed
    assert transport.committed == {P0: 3}
    assert transport.violations == []


# -- random interleavings: polls, batches ending, revokes, losses, assignments --


_PART = st.sampled_from([P0, P1])
_WHERE = st.sampled_from(["before the poll", "inside the poll", "inside, then back"])
_STEP = st.one_of(
    st.tuples(st.just("append"), _PART, st.integers(1, 4)),
    st.tuples(st.sampled_from(["turn", "batch ends", "all batches end"])),
    st.tuples(st.sampled_from(["revoke", "lose"]), _PART, _WHERE),
    st.tuples(st.just("assign"), _PART),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_STEP, max_size=40))
def test_no_interleaving_commits_past_a_record_not_settled_or_loses_one(
    steps: list[tuple[Any, ...]],
) -> None:
    transport = Audited({P0: [], P1: []}, FakeStore())
    executor = ManualExecutor()
    # A revoke waits a moment for a batch in flight, which here ends only
    # when a step says so: then its result is dropped (an orphan).
    runner = make(transport, executor, batch_max_messages=2, shutdown_timeout=0.001)

    for step in steps:
        if step[0] == "append":
            _, tp, count = step
            for _ in range(count):
                transport.append(event(tp, len(transport.logs[tp])))
        elif step[0] == "turn":
            runner.turn()
        elif step[0] == "batch ends":
            executor.run_next()
        elif step[0] == "all batches end":
            executor.run_all()
            runner.turn()
        elif step[0] in ("revoke", "lose"):
            _, tp, where = step
            act = transport.take_away(tp, lost=step[0] == "lose", back=where == "inside, then back")
            if where == "before the poll":
                act()
            else:
                transport.inside_poll.append(act)
        elif step[0] == "assign" and step[1] not in transport.assigned:
            transport.assign([step[1]])

    # Then, once every partition is back and every batch has ended,
    transport.inside_poll.clear()
    missing = [tp for tp in (P0, P1) if tp not in transport.assigned]
    if missing:
        transport.assign(missing)
    ends = {tp: len(log) for tp, log in transport.logs.items()}
    for _ in range(200):
        if transport.committed == {tp: end for tp, end in ends.items() if end}:
            break
        executor.run_all()
        runner.turn()
    # every commit had its records settled, every record was applied once, in
    # offset order per partition, and the offsets reached the end of each log.
    assert transport.violations == []
    effects = transport.store.effects
    assert len(effects) == len(set(effects))
    for tp, end in ends.items():
        assert [e for e in effects if e.startswith(f"{tp[1]}-")] == [
            f"{tp[1]}-{o}" for o in range(end)
        ]
    assert transport.committed == {tp: end for tp, end in ends.items() if end}
