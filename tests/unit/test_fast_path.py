"""The optimistic per-event path: no savepoints until a handler fails permanently."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from kinbox.app import App
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.core.errors import DeadLetter
from kinbox.core.event import Event
from kinbox.testing import FakePublisher, FakeStore, FakeTransport, InlineExecutor, record

pytestmark = pytest.mark.unit

T = "orders"


class Harness:
    def __init__(self, fail: Any, **settings: Any) -> None:
        self.calls: list[tuple[str, int]] = []
        app = App(group_id="g")

        @app.handler(T)
        def apply(event: Event, tx: Any) -> None:
            self.calls.append((event.id, event.attempt))
            tx.effects.append(event.id)
            fail(event)

        self.transport, self.store, self.publisher = FakeTransport(), FakeStore(), FakePublisher()
        config = Settings(database_url="postgresql:///x", group_id="g", **settings).validate()
        self.now = 0.0
        self.runner = Runner(
            app, config, self.transport, self.store, clock=lambda: self.now,
            publisher=self.publisher, executor=InlineExecutor(),
        )  # fmt: skip

    def run(self, ids: list[str], turns: int = 1) -> None:
        for offset, eid in enumerate(ids):
            self.transport.append(record(T, 0, offset, eid))
        self.transport.subscribe([T], self.runner)
        for _ in range(turns):
            self.runner.turn()
            self.now += 1000

    def dead(self) -> list[str]:
        return [id_ for id_, status in self.store.status.items() if status == "dead_lettered"]


def never(event: Event) -> None:
    pass


def test_a_clean_batch_takes_no_savepoint() -> None:
    h = Harness(never)
    h.run(["a", "b", "c"])
    assert h.store.effects == ["a", "b", "c"] and h.store.savepoints == 0
    assert h.transport.committed == {(T, 0): 3}


def test_a_permanent_failure_is_redone_carefully_without_running_the_poison_again() -> None:
    def poison(event: Event) -> None:
        if event.id.startswith("bad"):
            raise DeadLetter("unknown currency")

    h = Harness(poison)
    h.run(["a", "bad-1", "c", "bad-2", "e"])
    # Then each effect is committed once, both poison events are dead-lettered
    assert h.store.effects == ["a", "c", "e"]
    assert h.dead() == ["bad-1", "bad-2"]
    assert h.transport.committed == {(T, 0): 5}
    # The optimistic pass stopped at bad-1 (rolled back); the careful pass ran
    # every other event under a savepoint and did not call bad-1's handler
    # again; it found bad-2 and rolled back for the dead letters to go out;
    # the redo ran neither poison's handler
    careful = [("a", 1), ("c", 1), ("bad-2", 1), ("e", 1)]
    redo = [("a", 1), ("c", 1), ("e", 1)]
    assert h.calls == [("a", 1), ("bad-1", 1), *careful, *redo]
    assert h.store.savepoints == len(careful) + len(redo)
    assert len(h.publisher.acked) == 2


def test_retry_then_last_try_counts_attempts_as_the_savepoint_path_did() -> None:
    def always(event: Event) -> None:
        if event.id == "bad":
            raise RuntimeError("no such customer")

    h = Harness(always, max_attempts=2)
    h.run(["a", "bad", "c"], turns=2)
    assert h.store.effects == ["a", "c"] and h.dead() == ["bad"]
    assert h.transport.committed == {(T, 0): 3}
    assert h.publisher.headers(0)["kinbox.dlq.attempts"] == "2"
    # try 1: a, bad fails (rolled back), a again (committed); try 2 of bad is a
    # batch's first record: it fails for the last time, redone carefully with
    # c, and c once more after its dead letter went out
    assert h.calls == [("a", 1), ("bad", 1), ("a", 1), ("bad", 2), ("c", 1), ("c", 1)]


def test_a_retry_after_a_verdict_keeps_the_verdict() -> None:
    # Given a poison event, then one that fails to be retried, in one batch
    def mixed(event: Event) -> None:
        if event.id == "bad":
            raise DeadLetter("no")
        if event.id == "flaky" and event.attempt == 1:
            raise RuntimeError("try again")

    h = Harness(mixed)
    h.run(["a", "bad", "b", "flaky", "c"], turns=2)
    # Then the poison is dead-lettered once, its handler called once, and the
    # partition stopped at the flaky event before moving on
    assert h.store.effects == ["a", "b", "flaky", "c"]
    assert h.dead() == ["bad"] and len(h.publisher.acked) == 1
    assert [c for c in h.calls if c[0] == "bad"] == [("bad", 1)]
    assert h.transport.committed == {(T, 0): 5}


def test_a_clean_batch_runs_its_handlers_in_one_pipelined_block() -> None:
    h = Harness(never)
    h.run(["a", "b", "c"])
    assert h.store.pipelined == 1 and h.calls == [("a", 1), ("b", 1), ("c", 1)]


def test_a_refused_statement_under_the_pipeline_is_redone_without_it_and_blamed_on_its_event() -> (
    None
):
    # Given a statement the database refuses in the second event's handler (the
    # transaction is left aborted, as PostgreSQL leaves it), on its first try
    h = Harness(never)
    calls: list[str] = []
    app = App(group_id="g")

    @app.handler(T)
    def refused(event: Event, tx: Any) -> None:
        calls.append(event.id)
        if event.id == "bad":
            tx.fail(psycopg.errors.CheckViolation("amount out of range"))
        tx.effects.append(event.id)

    h.runner = Runner(
        app, Settings(database_url="postgresql:///x", group_id="g").validate(), h.transport,
        h.store, publisher=h.publisher, executor=InlineExecutor(),
    )  # fmt: skip
    h.run(["a", "bad", "c"])
    # Then the pipelined pass gave up without blaming anyone, the plain pass blamed
    # the right event (one try counted), and the event before it is applied once
    assert h.store.pipelined == 1
    assert calls == ["a", "bad", "a", "bad", "a"]
    assert h.store.effects == ["a"] and h.transport.committed == {(T, 0): 1}
    assert h.dead() == []
