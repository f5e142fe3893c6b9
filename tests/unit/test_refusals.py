"""Content the database refuses, with fakes: no record may stall its partition.

The fake store refuses like PostgreSQL would: an id in the claim, a reason
in the dead-letter bookkeeping, the transaction at COMMIT (a deferred
constraint). Wherever it happens, the refusal is pinned on one event; the
records before and after it are applied once.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from kinbox.app import App
from kinbox.core.errors import DeadLetter, EnvelopeError
from kinbox.core.event import Event
from kinbox.testing import postgres_accepts, record

from .test_failures import Harness, T, always, effect_app

pytestmark = pytest.mark.unit


def ids(*names: str) -> list[Any]:
    return [record(T, 0, offset, name) for offset, name in enumerate(names)]


class Calls:
    """An app applying ``event.id`` that remembers each handler call's (id, attempt)."""

    def __init__(self, fail: Any = None, **route: Any) -> None:
        self.calls: list[tuple[str, int]] = []

        def before(event: Event) -> None:
            self.calls.append((event.id, event.attempt))
            if fail is not None:
                fail(event)

        self.app = effect_app(before, **route)


# -- kinbox's claim ------------------------------------------------------------


def test_an_id_the_claim_refuses_is_dead_lettered_alone_and_the_rest_applied() -> None:
    # Given an id the database cannot store, which the envelope's check let through
    h = Harness(effect_app())
    h.store.refuse_id = lambda event_id: event_id == "unstorable"
    h.add(*ids("a", "b", "c", "unstorable", "e", "f", "g"))
    h.run()
    # Then only that record is given up, as an invalid id, and the others applied once
    assert h.store.effects == ["a", "b", "c", "e", "f", "g"]
    assert h.committed == 7
    derived = f"{T}/0/3"
    assert h.store.status[derived] == "dead_lettered"
    assert h.store.reasons[derived].startswith(
        "invalid-id: EnvelopeError: event id 'unstorable' cannot be stored: DataError"
    )
    headers = h.publisher.headers(0)
    assert (headers["kinbox.dlq.reason"], headers["kinbox.dlq.attempts"]) == ("invalid-id", "0")
    assert headers["kinbox.dlq.offset"] == "3" and len(h.publisher.acked) == 1
    # found by splitting the batch: a handful of claims, not one per record
    # (its dead letter's own part claimed twice: before and after it went out)
    refused = [claim for claim in h.store.claims if "unstorable" in claim]
    assert refused[-1] == ["unstorable"] and len(h.store.claims) <= 9


def test_an_unstorable_id_under_derive_is_applied_under_its_position() -> None:
    h = Harness(effect_app(), missing_id="derive")
    h.store.refuse_id = lambda event_id: event_id == "unstorable"
    h.add(*ids("a", "unstorable", "c"))
    h.run()
    assert h.store.effects == ["a", f"{T}/0/1", "c"]
    assert h.publisher.acked == [] and h.committed == 3


def test_an_unstorable_id_under_fail_stops_the_worker_after_the_records_before_it() -> None:
    h = Harness(effect_app(), missing_id="fail")
    h.store.refuse_id = lambda event_id: event_id == "unstorable"
    h.add(*ids("a", "b", "unstorable", "d"))
    with pytest.raises(EnvelopeError, match="event id 'unstorable' cannot be stored"):
        h.run()
    h.runner._offsets.commit()  # what run()'s finally does on the way out
    assert h.store.effects == ["a", "b"] and h.committed == 2


def test_when_even_the_derived_id_is_refused_the_partition_waits_without_verdicts() -> None:
    # Given a database that refuses every claim (not the ids' fault)
    h = Harness(effect_app(), max_attempts=1)
    h.store.refuse_id = lambda event_id: True
    h.add(*ids("a", "b"))
    h.run(turns=3)
    # Then nothing is given up: the partition waits, as for an outage
    assert h.store.status == {} and h.publisher.acked == [] and h.committed is None
    assert (T, 0) in h.transport.paused
    # And once the database takes them, everything is applied
    h.store.refuse_id = lambda event_id: False
    h.run(turns=2)
    assert h.store.effects == ["a", "b"] and h.committed == 2


# -- COMMIT (a deferred constraint) -------------------------------------------


def test_a_refused_commit_is_pinned_on_its_event_which_counts_tries() -> None:
    # Given a deferred constraint that refuses the effect of "bad" only at COMMIT
    app = Calls()
    h = Harness(app.app, max_attempts=3)
    h.store.refuse_commit = lambda effects: "bad" in effects
    names = ["a", "b", "c", "d", "e", "bad", "g", "h", "i"]
    h.add(*ids(*names))
    h.run()
    # Then the records before it commit and the partition stops at it (try 1)
    assert h.store.effects == ["a", "b", "c", "d", "e"] and h.committed == 5
    h.run()
    assert h.committed == 5 and h.publisher.acked == []
    h.run()
    # On its third try it is dead-lettered, without its handler running again
    assert h.store.effects == ["a", "b", "c", "d", "e", "g", "h", "i"]
    assert h.committed == 9
    assert h.store.status["bad"] == "dead_lettered"
    assert h.store.reasons["bad"].startswith("handler-error: StoreError: UniqueViolation")
    [letter] = h.publisher.acked
    assert h.publisher.headers(0)["kinbox.dlq.attempts"] == "3"
    assert ("event-id", b"bad") in letter.headers
    assert {attempt for name, attempt in app.calls if name == "bad"} == {1, 2, 3}
    # its last pass, the one that dead-lettered it, did not call its handler
    assert app.calls[-4:] == [("bad", 3), ("g", 1), ("h", 1), ("i", 1)]


def test_narrowing_a_large_batch_down_takes_logarithmically_many_transactions() -> None:
    h = Harness(effect_app(), max_attempts=1)
    h.store.refuse_commit = lambda effects: "bad" in effects
    names = [f"e{n}" for n in range(400)]
    names[263] = "bad"
    h.add(*ids(*names))
    h.run()
    assert h.store.status["bad"] == "dead_lettered" and h.committed == 400
    assert len(h.store.effects) == 399
    # log2(400) is under 9: two per halving, plus the culprit's own pass and the rest
    assert h.store.transactions <= 2 * 9 + 3, h.store.transactions


def test_a_dead_letter_and_a_refused_commit_in_one_batch_send_one_letter_each() -> None:
    # Given a poison event before an event whose COMMIT is refused
    def poison(event: Event) -> None:
        if event.id == "poison":
            raise DeadLetter("no such customer")

    h = Harness(effect_app(poison), max_attempts=1)
    h.store.refuse_commit = lambda effects: "bad" in effects
    h.add(*ids("a", "poison", "b", "bad", "c"))
    h.run()
    # Then the deferred checks ran before the dead letters went out: one copy each
    sent = [h.publisher.headers(i)["kinbox.dlq.offset"] for i in range(len(h.publisher.acked))]
    assert sorted(sent) == ["1", "3"]
    assert h.store.effects == ["a", "b", "c"] and h.committed == 5


def test_a_refused_commit_with_a_batch_handler_is_pinned_too() -> None:
    app = App(group_id="g")

    @app.handler(T, batch=True, max_attempts=2)
    def many(events: list[Event], tx: Any) -> None:
        tx.effects.extend(event.id for event in events)

    h = Harness(app)
    h.store.refuse_commit = lambda effects: "bad" in effects
    h.add(*ids("a", "b", "bad", "d", "e"))
    h.run(turns=2)
    assert h.store.effects == ["a", "b", "d", "e"]
    assert h.store.status["bad"] == "dead_lettered" and h.committed == 5


def test_commit_refused_for_an_event_whose_handler_did_not_run_waits() -> None:
    # Given a COMMIT refused whatever the transaction holds (the database's fault)
    h = Harness(effect_app(), max_attempts=1)
    h.store.refuse_commit = lambda effects: True
    h.add(*ids("a"))
    h.run(turns=3)
    # Then the event is never dead-lettered: its last pass ran no handler and still failed
    assert h.publisher.acked == [] and h.store.status == {} and h.committed is None
    h.store.refuse_commit = lambda effects: False
    h.run(turns=2)
    assert h.store.effects == ["a"] and h.committed == 1


# -- a handler's own statements ------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        psycopg.errors.ProgramLimitExceeded("index row size 3000 exceeds btree maximum 2704"),
        psycopg.errors.StringDataRightTruncation("value too long for type character varying(8)"),
        psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
        psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
        psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_refused_handler_statement_counts_tries_and_is_dead_lettered(error: Exception) -> None:
    def write(event: Event) -> None:
        if event.id == "bad":
            raise error

    app = Calls(write)
    h = Harness(app.app, max_attempts=2)
    h.add(*ids("a", "bad", "c"))
    h.run(turns=2)
    assert [c for c in app.calls if c[0] == "bad"] == [("bad", 1), ("bad", 2)]
    assert h.store.effects == ["a", "c"] and h.committed == 3
    headers = h.publisher.headers(0)
    assert headers["kinbox.dlq.error.type"] == "StoreError"
    assert headers["kinbox.dlq.error.message"].startswith(type(error).__name__)


def test_an_outage_seen_by_a_handler_still_never_counts() -> None:
    outage = [3]

    def write(event: Event) -> None:
        if outage[0]:
            outage[0] -= 1
            raise psycopg.errors.AdminShutdown("terminating connection due to administrator")

    h = Harness(effect_app(write), max_attempts=1)
    h.add(*ids("a"))
    h.run(turns=4)
    assert h.publisher.acked == [] and h.store.effects == ["a"] and h.committed == 1


# -- kinbox's bookkeeping never fails on content -----------------------------------


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")


class NotText(Exception):
    def __str__(self) -> str:
        return 42  # type: ignore[return-value]


NASTY: dict[str, BaseException] = {
    "nul": ValueError("bad byte \x00 in payload"),
    "surrogate": ValueError(b"caf\xe9 \xff".decode("utf-8", "surrogateescape")),
    "broken-str": BrokenStr(),
    "not-text": NotText(),
    "huge": ValueError("x" * 1_000_000),
    "requested-nul": DeadLetter("refused \x00 \udcff"),
    "requested-not-text": DeadLetter(b"\xff\x00"),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("name", sorted(NASTY))
@pytest.mark.parametrize("max_attempts", [1, 2])
def test_exception_text_never_breaks_the_bookkeeping(name: str, max_attempts: int) -> None:
    def fail(event: Event) -> None:
        if event.id == "bad":
            raise NASTY[name]

    h = Harness(effect_app(fail), max_attempts=max_attempts)
    h.add(*ids("a", "bad", "c"))
    h.run(turns=max_attempts)
    # Then the verdict is recorded, storable, and the dead letter's headers encode
    assert h.store.status["bad"] == "dead_lettered" and h.committed == 3
    reason = h.store.reasons["bad"]
    assert postgres_accepts(reason) and len(reason.encode()) <= 1000
    headers = h.publisher.headers(0)  # decodes every header value as UTF-8
    assert len(headers["kinbox.dlq.error.message"].encode()) <= 1000
    assert h.store.effects == ["a", "c"]


def test_a_reason_the_database_refuses_is_recorded_as_its_bare_code() -> None:
    h = Harness(effect_app(always(DeadLetter("evil"))))
    h.store.refuse_reason = lambda reason: "evil" in reason
    h.add(*ids("bad"))
    h.run()
    assert h.store.reasons["bad"] == "dead-letter-requested" and h.committed == 1
    # the dead letter itself still says why
    assert h.publisher.headers(0)["kinbox.dlq.reason"] == "dead-letter-requested: evil"
    assert len(h.publisher.acked) == 1


def test_when_even_the_bare_code_is_refused_the_partition_waits() -> None:
    h = Harness(effect_app(always(DeadLetter("no"))))
    h.store.refuse_reason = lambda reason: True
    h.add(*ids("a", "bad"))
    h.run(turns=2)
    assert h.committed is None and h.store.status == {} and h.publisher.acked == []
    h.store.refuse_reason = lambda reason: False
    h.run()
    assert h.store.status == {"a": "applied", "bad": "dead_lettered"} and h.committed == 2
