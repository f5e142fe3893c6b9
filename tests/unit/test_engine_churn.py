"""Failures, outages, the circuit breaker, backoff and rebalances, in any interleaving.

Each part holds partitions for a reason of its own (a full lane, a backoff,
an open or half-open breaker) and rewinds them, while the group takes
partitions away and gives them back, inside a poll or between two. Events
fail by raising or by swallowing a refused statement; the database goes
away under the handler. Random interleavings of all of it, with time
passing, must keep invariant 2 (no offset committed past a record not
settled) and must never leave a partition stalled: once the handler and the
database work again, every record is applied or dead-lettered exactly once,
every offset reaches the end of its log, and nothing stays paused.
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinbox.app import App
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.event import Event
from kinbox.core.record import Record
from kinbox.core.transport import Partition
from kinbox.testing import FakePublisher, FakeStore
from tests.support.engine import Audited, ManualExecutor, event, event_id

pytestmark = pytest.mark.unit

T = "orders"
PARTS = [(T, 0), (T, 1), (T, 2)]


class World:
    """A member on the fakes, with a handler that fails while the deploy is broken.

    ``ordering``: the handler's (``"key"``: two keys per partition, run
    concurrently, each in offset order).
    """

    def __init__(self, ordering: str) -> None:
        self.ordering = ordering
        self.now = 0.0
        self.broken = False  # every event's handler raises
        self.down = False  # the database is gone under every handler
        self.poison: dict[str, str] = {}  # id -> how its handler always fails
        self.store = FakeStore()
        self.transport = Audited({tp: [] for tp in PARTS}, self.store)
        self.executor = ManualExecutor()
        self.publisher = FakePublisher()
        app = App(group_id="g")

        # Under key order two keys of a partition run side by side.
        keyed: dict[str, Any] = {"ordering": "key", "concurrency": 2} if ordering == "key" else {}

        @app.handler(T, max_attempts=2, **keyed)
        def apply(event: Event, tx: Any) -> None:
            if self.down:
                tx.lose()
            how = self.poison.get(event.id)
            if how == "swallows":
                # A refused statement, caught: the transaction is left aborted.
                with contextlib.suppress(psycopg.Error):
                    tx.fail(psycopg.errors.UniqueViolation("duplicate key"))
                return
            if self.broken or how == "raises":
                raise RuntimeError("the handler fails")
            tx.effects.append(event.id)

        config = Settings(
            database_url="postgresql:///x",
            group_id="g",
            batch_max_messages=2,
            pool_size=2,
            retry_initial=0.1,
            retry_max=0.4,
            breaker_failures=2,
            breaker_pause=1.0,
            # A revoke waits a moment for a batch in flight, which here ends
            # only when a step says so: then its result is dropped (an orphan).
            shutdown_timeout=0.001,
        ).validate()
        self.runner = Runner(
            app,
            config,
            self.transport,
            self.store,
            clock=self.clock,
            publisher=self.publisher,
            executor=self.executor,
        )
        self.transport.subscribe([T], self.runner)

    def clock(self) -> float:
        # Every reading moves time on a little, so a poll is never "recent".
        self.now += 0.01
        return self.now

    def append(self, tp: Partition) -> Record:
        """The next record of ``tp``, keyed by its offset's parity under key order."""
        made = event(tp, len(self.transport.logs[tp]))
        if self.ordering == "key":
            made = made._replace(key=b"k%d" % (made.offset % 2))
        self.transport.append(made)
        return made

    def turn(self) -> None:
        self.publisher.serve(0)
        self.runner.turn()


_PART = st.sampled_from(PARTS)
_WHERE = st.sampled_from(["before the poll", "inside the poll", "inside, then back"])
_STEP = st.one_of(
    st.tuples(
        st.just("append"), _PART, st.integers(1, 3), st.sampled_from([None, "raises", "swallows"])
    ),
    st.tuples(
        st.sampled_from(["turn", "turn", "batch ends", "all batches end", "all batches end"])
    ),
    st.tuples(st.just("time passes"), st.sampled_from([0.05, 0.3, 1.2])),
    st.tuples(st.sampled_from(["deploy breaks", "deploy breaks", "deploy fixed"])),
    st.tuples(st.sampled_from(["database down", "database up"])),
    st.tuples(st.sampled_from(["revoke", "lose"]), _PART, _WHERE),
    st.tuples(st.just("assign"), _PART),
)


@pytest.mark.parametrize("ordering", ["partition", "key"])
@settings(max_examples=300, deadline=None)
@given(st.lists(_STEP, min_size=10, max_size=60))
def test_no_interleaving_of_failures_and_rebalances_commits_early_or_stalls_a_partition(
    ordering: str, steps: list[tuple[Any, ...]]
) -> None:
    world = World(ordering)
    transport = world.transport
    for tp in PARTS:  # something to work on from the start
        world.append(tp)
    for step in steps:
        kind = step[0]
        if kind == "append":
            _, tp, count, how = step
            for _ in range(count):
                record = world.append(tp)
                if how is not None:
                    world.poison[event_id(record)] = how
                    how = None  # one poison event per step at most
        elif kind == "turn":
            world.turn()
        elif kind == "batch ends":
            world.executor.run_next()
        elif kind == "all batches end":
            world.executor.run_all()
            world.turn()
        elif kind == "time passes":
            world.now += step[1]
        elif kind == "deploy breaks":
            world.broken = True
        elif kind == "deploy fixed":
            world.broken = False
        elif kind in ("database down", "database up"):
            world.down = kind == "database down"
        elif kind in ("revoke", "lose"):
            _, tp, where = step
            act = transport.take_away(tp, lost=kind == "lose", back=where == "inside, then back")
            if where == "before the poll":
                act()
            else:
                transport.inside_poll.append(act)
        elif kind == "assign" and step[1] not in transport.assigned:
            transport.assign([step[1]])

    # Then, once the handler and the database work, every partition is back and time goes on,
    world.broken = world.down = False
    transport.inside_poll.clear()
    missing = [tp for tp in PARTS if tp not in transport.assigned]
    if missing:
        transport.assign(missing)
    ends = {tp: len(log) for tp, log in transport.logs.items()}
    done = {tp: end for tp, end in ends.items() if end}
    for _ in range(400):
        if transport.committed == done and not transport.paused:
            break
        world.executor.run_all()
        world.turn()
        world.now += 0.1
    # every commit had its records settled,
    assert transport.violations == []
    # every record was settled once: applied in offset order (of its key,
    # under key order), or dead-lettered (a poison event always; another only
    # while the deploy was broken),
    effects = world.store.effects
    assert len(effects) == len(set(effects))
    dead = {i for i, s in world.store.status.items() if s == "dead_lettered"}
    assert set(world.poison) <= dead and not dead & set(effects)
    for log in transport.logs.values():
        for key in {r.key for r in log}:
            ids = [event_id(r) for r in log if r.key == key]
            assert [e for e in effects if e in ids] == [i for i in ids if i not in dead]
            assert set(ids) <= dead | set(effects)
    # and no partition stalled: every offset at the end of its log, none paused.
    assert transport.committed == done
    assert not transport.paused
