"""The consuming engine on the fakes: an audited broker, batches that end when a test says.

The property tests of the runner (:mod:`tests.unit.test_revoke_inside_poll`,
:mod:`tests.unit.test_engine_churn`) step a real
:class:`~kinbox.consume.runner.Runner` over :class:`~kinbox.testing.FakeTransport`
and :class:`~kinbox.testing.FakeStore`. Every commit is audited against
invariant 2: each record below the offset is settled in the (fake) database
when the offset is committed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

from kinbox.core.record import Record
from kinbox.core.transport import Partition
from kinbox.testing import FakeStore, FakeTransport, record

P = ParamSpec("P")
R = TypeVar("R")


def event(tp: Partition, offset: int) -> Record:
    """The record at ``offset`` of ``tp``; its event id is ``<partition>-<offset>``."""
    return record(tp[0], tp[1], offset, f"{tp[1]}-{offset}")


def event_id(r: Record) -> str:
    """The event id a record carries in its ``event-id`` header."""
    return dict(r.headers)["event-id"].decode()  # type: ignore[union-attr]


class Audited(FakeTransport):
    """A fake broker that checks every commit against the database it is given."""

    def __init__(self, logs: Mapping[Partition, list[Record]], store: FakeStore) -> None:
        super().__init__(logs)
        self.store = store
        self.violations: list[str] = []

    def commit(self, offsets: Mapping[Partition, int], *, asynchronous: bool = False) -> None:
        """Record a violation for each record below an offset that is not settled."""
        for tp, offset in offsets.items():
            unsettled = [
                r.offset for r in self.logs[tp][:offset] if event_id(r) not in self.store.status
            ]
            if unsettled:
                self.violations.append(f"{tp}@{offset} committed, {unsettled} not settled")
        super().commit(offsets, asynchronous=asynchronous)

    def take_away(self, tp: Partition, *, lost: bool, back: bool) -> Callable[[], None]:
        """A rebalance step: revoke (or lose) ``tp`` if assigned, and give it ``back`` at once."""

        def act() -> None:
            if tp in self.assigned:
                self.revoke([tp], lost=lost)
                if back:
                    self.assign([tp])

        return act


class ManualExecutor(Executor):
    """Runs a submitted job only when the test says so (:meth:`run_next`)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Callable[[], Any], Future[Any]]] = []

    def submit(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> Future[R]:
        """Queue ``fn``; its future is done once :meth:`run_next` ran it."""
        future: Future[R] = Future()
        self.jobs.append((lambda: fn(*args, **kwargs), future))
        return future

    def run_next(self) -> None:
        """Run the oldest job queued, if any."""
        if self.jobs:
            job, future = self.jobs.pop(0)
            future.set_result(job())

    def run_all(self) -> None:
        """Run every job queued, in order."""
        while self.jobs:
            self.run_next()
