"""The runner with batches of several partitions in flight at once, on real threads, over fakes.

What the side-by-side runner must keep: at most one batch in flight per
partition (offset order), offsets only after their own transaction and
contiguous, never for a partition revoked or lost meanwhile, a lost
partition's batch orphaned until it ends, the shutdown settling what is in
flight, and the lanes holding a partition whose records pile up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from kinbox.app import App
from kinbox.consume.lanes import Lanes
from kinbox.consume.pauses import PauseLedger
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.event import Event
from kinbox.core.record import Record
from kinbox.middleware.base import Middleware
from kinbox.testing import FakePublisher, FakeStore, FakeTransport, record

pytestmark = pytest.mark.unit

T = "lessons"


class Gate(Middleware):
    """Holds the batches of ``partitions`` before their transaction until :meth:`open`.

    Outside the transaction, so the fake store (one transaction at a time)
    lets the other partitions through. Records when each batch began and ended.
    """

    def __init__(self, partitions: set[int]) -> None:
        self.partitions = partitions
        self._open = threading.Event()
        self.lock = threading.Lock()
        self.spans: list[tuple[int, int, str]] = []  # (partition, first offset, begin|end)

    def open(self) -> None:
        self._open.set()

    def before_batch(self, topic: str, partition: int, records: Sequence[Record]) -> None:
        with self.lock:
            self.spans.append((partition, records[0].offset, "begin"))
        if partition in self.partitions:
            assert self._open.wait(10), "never released"

    def after_batch(self, topic: str, partition: int, records: Sequence[Record], *_: Any) -> None:
        with self.lock:
            self.spans.append((partition, records[0].offset, "end"))


class Loop:
    """A runner on worker threads (``pool_size`` of them) over a fake transport and store."""

    def __init__(self, gate: Gate, pool_size: int = 3, **settings: Any) -> None:
        self.gate = gate
        self.app = App(group_id="g", middleware=[gate])
        self.seen: list[tuple[int, int]] = []

        @self.app.handler(T)
        def apply(event: Event, tx: Any) -> None:
            self.seen.append((event.partition, event.offset))
            tx.effects.append((event.partition, event.offset))

        self.transport, self.store = FakeTransport(), FakeStore()
        config = Settings(
            database_url="postgresql:///x", group_id="g", pool_size=pool_size, **settings
        ).validate()
        publisher = FakePublisher()
        self.runner = Runner(self.app, config, self.transport, self.store, publisher=publisher)

    def add(self, partition: int, count: int) -> None:
        start = len(self.transport.logs.get((T, partition), []))
        for offset in range(start, start + count):
            self.transport.append(record(T, partition, offset, f"{partition}-{offset}"))

    def turn_until(self, done: Any, timeout: float = 10.0) -> None:
        if self.transport.listener is None:
            self.transport.subscribe([T], self.runner)
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, "the loop never got there"
            self.runner.turn()


def test_partitions_run_side_by_side_but_each_one_batch_at_a_time_in_order() -> None:
    loop = Loop(Gate(set()), batch_max_messages=5)
    for partition in range(3):
        loop.add(partition, 23)
    loop.turn_until(lambda: loop.transport.committed == {(T, p): 23 for p in range(3)})
    # Every event once, each partition's in offset order
    for partition in range(3):
        assert [o for p, o in loop.seen if p == partition] == list(range(23))
    # A partition's batches never overlapped: each began after the one before it ended
    for partition in range(3):
        spans = [(o, kind) for p, o, kind in loop.gate.spans if p == partition]
        kinds = [kind for _, kind in spans]
        assert kinds == ["begin", "end"] * (len(kinds) // 2), spans


def test_a_held_partition_commits_nothing_past_its_batch_while_the_others_commit() -> None:
    # Given partition 0's first batch held before its transaction, and more records behind it
    loop = Loop(Gate({0}), batch_max_messages=4)
    loop.add(0, 10)
    loop.add(1, 10)
    # When the others are done
    loop.turn_until(lambda: loop.transport.committed.get((T, 1)) == 10)
    # Then partition 0 has nothing committed, its later records waited (not applied)
    assert (T, 0) not in loop.transport.committed
    assert not any(p == 0 for p, _ in loop.seen)
    # And once released, it commits contiguously up to its end
    loop.gate.open()
    loop.turn_until(lambda: loop.transport.committed.get((T, 0)) == 10)
    assert [o for p, o in loop.seen if p == 0] == list(range(10))


def test_one_connection_means_one_batch_at_a_time() -> None:
    loop = Loop(Gate(set()), pool_size=1, batch_max_messages=3)
    loop.add(0, 6)
    loop.add(1, 6)
    loop.turn_until(lambda: loop.transport.committed == {(T, 0): 6, (T, 1): 6})
    kinds = [kind for _, _, kind in loop.gate.spans]
    assert kinds == ["begin", "end"] * (len(kinds) // 2)


def test_a_lost_partitions_batch_is_orphaned_and_its_next_owner_era_waits_for_it() -> None:
    # Given partition 0's batch in flight (held)
    loop = Loop(Gate({0}), batch_max_messages=5)
    loop.add(0, 5)
    loop.turn_until(lambda: (0, 0, "begin") in loop.gate.spans)
    # When the partition is lost, then assigned back to this member
    loop.transport.revoke([(T, 0)], lost=True)
    loop.transport.assign([(T, 0)])
    for _ in range(20):
        loop.runner.turn()
    # Then no second batch of it starts while the orphan runs, and nothing is committed
    assert [s for s in loop.gate.spans if s[0] == 0] == [(0, 0, "begin")]
    assert loop.transport.committed == {}
    # When the orphan ends, its result is dropped (no commit from it) and the
    # partition starts again from its committed offset; the inbox drops the repeats
    loop.gate.open()
    loop.turn_until(lambda: loop.transport.committed.get((T, 0)) == 5)
    begins = [o for p, o, kind in loop.gate.spans if p == 0 and kind == "begin"]
    assert begins == [0, 0]
    assert sorted(loop.store.effects) == [(0, o) for o in range(5)]


def test_stop_settles_the_batches_in_flight_and_commits_them() -> None:
    # Given batches in flight on two partitions when the worker is asked to stop
    gate = Gate({0, 1})
    loop = Loop(gate, batch_max_messages=10)
    loop.add(0, 4)
    loop.add(1, 4)
    worker = threading.Thread(target=loop.runner.run)
    worker.start()
    deadline = time.monotonic() + 10
    while sum(kind == "begin" for _, _, kind in list(gate.spans)) < 2:
        assert time.monotonic() < deadline, gate.spans
        time.sleep(0.01)
    loop.runner.stop()
    gate.open()
    worker.join(10)
    # Then both batches finished and their offsets were committed on the way out
    assert not worker.is_alive()
    assert loop.transport.committed == {(T, 0): 4, (T, 1): 4}
    assert loop.transport.closed and loop.store.closed


def test_an_asynchronous_commit_that_failed_is_sent_again_while_the_partition_is_ours() -> None:
    from kinbox.core.errors import TransportError

    loop = Loop(Gate(set()), batch_max_messages=5)
    loop.add(0, 5)
    loop.transport.commit_errors.append(TransportError("coordinator loading", retriable=True))
    loop.turn_until(lambda: loop.transport.committed.get((T, 0)) == 5)
    # The failed one, then the retry: the same offset, both asynchronous
    assert [c for c in loop.transport.commit_calls if c] == [{(T, 0): 5}, {(T, 0): 5}]


def test_a_lane_that_fills_up_holds_its_partition_and_resumes_it_half_empty() -> None:
    transport, tp = FakeTransport(), (T, 0)
    pauses = PauseLedger(transport)
    pauses.assign([tp])
    lanes = Lanes(pauses, batch=2, budget=100, per_lane=4)
    lanes.add(tp, [record(T, 0, o, str(o)) for o in range(7)])
    assert lanes.cap == 8 and tp not in transport.paused
    lanes.add(tp, [record(T, 0, 7, "7")])
    assert tp in transport.paused and lanes.held == {tp}
    assert [r.offset for r in lanes.take(tp, 2)] == [0, 1]
    lanes.unhold()
    assert tp in transport.paused  # 6 left: more than half of the cap
    lanes.take(tp, 2)
    lanes.unhold()
    assert tp not in transport.paused and lanes.held == set()
    assert [r.offset for r in lanes.take(tp, 10)] == [4, 5, 6, 7]


def test_many_partitions_share_the_budget_never_below_one_batch_each() -> None:
    lanes = Lanes(PauseLedger(FakeTransport()), batch=10, budget=160, per_lane=4)
    lanes.share(3)
    assert lanes.cap == 40
    lanes.share(8)
    assert lanes.cap == 20
    lanes.share(100)
    assert lanes.cap == 10
