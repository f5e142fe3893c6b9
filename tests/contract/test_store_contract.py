"""The inbox store contract, run over the fake store and the real PostgreSQL stores, sync and async.

What the batch processor relies on (:mod:`kinbox.core.inbox`, :mod:`kinbox.core.steps`),
checked through the seam alone — programs run by :meth:`InboxStore.run` —
plus a look at the committed ``processed_events`` rows: the claim decides
freshness once per (consumer, id), across transactions and within one
claim; a rollback forgets a claim; a replay may take over a dead-lettered
row and nothing else; savepoints undo only their own work; a handler that
swallows a database error is blamed; an outage is told from an event's
fault; and an ambiguous COMMIT has happened.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
import pytest

from kinbox.core.describe import storable
from kinbox.core.errors import StoreError
from kinbox.core.event import Event
from kinbox.core.inbox import InboxStore
from kinbox.core.reuse import Sighting
from kinbox.core.steps import CheckReused, Claim, DeadLetterRow, Guard, Seen, Steps
from tests.contract.store_sides import FAIL, OUTAGE, REFUSED, SWALLOWED, Row, StoreSide

T = "contract-events"
GUARDS: tuple[Guard, ...] = ("savepoint", "unguarded")


def ev(event_id: str, offset: int = 0, value: bytes = b"{}") -> Event:
    return Event(id=event_id, topic=T, partition=0, offset=offset, key=None, value=value)


def claim(store: InboxStore, *events: Event, reclaim: Sequence[str] = ()) -> list[tuple[str, int]]:
    """Claim ``events`` in a transaction of their own; the fresh ones as (id, offset)."""

    def program(_tx: Seen) -> Steps[list[Event]]:
        fresh: list[Event] = yield Claim(list(events), reclaim)
        return fresh

    return [(e.id, e.offset) for e in store.run(program)]


def run(store: InboxStore, program: Callable[[], Steps[Any]]) -> Any:
    """``program`` (which needs nothing of its transaction) in a transaction of ``store``."""
    return store.run(lambda _tx: program())


def test_a_claim_returns_the_fresh_events_in_the_order_given(inbox: StoreSide) -> None:
    assert claim(inbox.store, ev("c", 0), ev("a", 1), ev("b", 2)) == [("c", 0), ("a", 1), ("b", 2)]
    assert [inbox.row(i) for i in "cab"] == [Row("applied", None, o) for o in range(3)]
    assert inbox.row("never-claimed") is None


def test_within_one_claim_the_first_occurrence_of_an_id_wins(inbox: StoreSide) -> None:
    fresh = claim(inbox.store, ev("a", 0), ev("b", 1), ev("a", 2), ev("b", 3), ev("c", 4))
    assert fresh == [("a", 0), ("b", 1), ("c", 4)]
    assert inbox.row("a") == Row("applied", None, 0)


AWKWARD_IDS = ['a"b', "c\\d", '\\"', "{x}", "NULL", " sp ", "a,b", "é-ü", "'", "}{", '""']


def test_a_claim_keeps_every_id_exactly_whatever_characters_it_holds(inbox: StoreSide) -> None:
    # Quotes, backslashes, braces, commas, spaces, NULL: what an array literal must escape
    events = [ev(event_id, offset) for offset, event_id in enumerate(AWKWARD_IDS)]
    assert claim(inbox.store, *events) == [(e.id, e.offset) for e in events]
    assert [inbox.row(i) for i in AWKWARD_IDS] == [
        Row("applied", None, o) for o in range(len(AWKWARD_IDS))
    ]
    assert claim(inbox.store, *events) == []  # each found again under its own id


def test_a_claim_of_one_event_keeps_its_id_exactly_too(inbox: StoreSide) -> None:
    # One event's claim sends plain values, not array literals
    for offset, event_id in enumerate(AWKWARD_IDS):
        assert claim(inbox.store, ev(event_id, offset)) == [(event_id, offset)]
        assert claim(inbox.store, ev(event_id, offset + 100)) == []
    assert [inbox.row(i) for i in AWKWARD_IDS] == [
        Row("applied", None, o) for o in range(len(AWKWARD_IDS))
    ]


def again(*ids: str, value: bytes = b"{}") -> list[Event]:
    """The look-up's argument: a record of each id holding ``value`` (``ev``'s default),
    at a position no claim of these tests took."""
    return [ev(event_id, 1000 + n, value) for n, event_id in enumerate(ids)]


def test_known_reads_the_consumers_committed_rows_only_and_never_waits(inbox: StoreSide) -> None:
    claim(inbox.store, ev("a", 0), *[ev(event_id, 1) for event_id in AWKWARD_IDS])
    looker = inbox.looker()

    def program() -> Steps[None]:
        yield Claim([ev("b", 2)])
        # b is claimed, not committed: neither seen nor waited for
        assert looker.known(again("a", "b", "c")) == {"a"}

    run(inbox.store, program)
    assert inbox.store.known(again("a", "b", "c")) == {"a", "b"}
    assert inbox.store.known(again(*AWKWARD_IDS)) == set(AWKWARD_IDS)
    assert inbox.store.known([]) == set()
    assert inbox.other_consumer().known(again("a", "b")) == set()


def test_known_leaves_an_id_recorded_with_another_payload_to_the_claim(inbox: StoreSide) -> None:
    claim(inbox.store, ev("a", 0, b"1"), ev("b", 1, b"1"))
    # b comes again with another payload: not known, so its claim reports the reuse
    assert inbox.store.known([*again("a", value=b"1"), *again("b", value=b"2")]) == {"a"}
    assert claimed_and_reused(inbox.store, ev("b", 5, b"2")) == [("b", 5, 1)]


def test_known_compares_payloads_even_at_the_claims_own_position(inbox: StoreSide) -> None:
    claim(inbox.store, ev("a", 0, b"1"), ev("b", 1, b"1"))
    # The same record again is known wherever it comes; another payload at
    # the very position of the claim (a topic deleted and created again,
    # starting its offsets over) is not: its claim reports the reuse
    assert inbox.store.known([ev("a", 0, b"1"), ev("b", 7, b"1")]) == {"a", "b"}
    assert inbox.store.known([ev("a", 0, b"2")]) == set()
    moved = Event(id="b", topic="elsewhere", partition=1, offset=1, key=None, value=b"1")
    assert inbox.store.known([moved]) == {"b"}
    assert inbox.store.known([moved._replace(value=b"2")]) == set()
    assert claimed_and_reused(inbox.store, ev("a", 0, b"2")) == [("a", 0, 0)]


def test_known_refuses_an_id_it_cannot_send_as_the_claim_would(inbox: StoreSide) -> None:
    with pytest.raises(StoreError) as refused:
        inbox.store.known(again("ok", "lone \ud800 surrogate"))
    assert not refused.value.transient
    assert inbox.store.known(again("ok")) == set()  # and the store goes on


def test_a_claim_of_several_partitions_keeps_their_order_and_places(inbox: StoreSide) -> None:
    places = [(T, 1, 5), (T, 0, 9), ("other", 0, 7), (T, 1, 6)]
    mixed = [Event(id=f"{t}/{p}/{o}", topic=t, partition=p, offset=o, key=None, value=b"")
             for t, p, o in places]  # fmt: skip
    assert claim(inbox.store, *mixed) == [(e.id, e.offset) for e in mixed]
    assert [inbox.row(e.id) for e in mixed] == [Row("applied", None, o) for _, _, o in places]


def test_an_id_claimed_by_an_earlier_transaction_is_not_fresh(inbox: StoreSide) -> None:
    claim(inbox.store, ev("a", 0))
    assert claim(inbox.store, ev("a", 7), ev("b", 8)) == [("b", 8)]
    assert inbox.row("a") == Row("applied", None, 0)  # the first delivery's row stays


def test_the_dedup_scope_is_the_consumer(inbox: StoreSide) -> None:
    claim(inbox.store, ev("a"))
    assert claim(inbox.other_consumer(), ev("a")) == [("a", 0)]


def test_a_rolled_back_claim_is_forgotten(inbox: StoreSide) -> None:
    def program() -> Steps[None]:
        assert len((yield Claim([ev("a"), ev("b", 1)]))) == 2
        raise RuntimeError("the batch failed")

    with pytest.raises(RuntimeError):
        run(inbox.store, program)
    assert inbox.row("a") is None
    assert claim(inbox.store, ev("a"), ev("b", 1)) == [("a", 0), ("b", 1)]


def test_a_replay_takes_over_a_dead_lettered_row_and_never_an_applied_one(
    inbox: StoreSide,
) -> None:
    def program() -> Steps[None]:
        dead, _ = yield Claim([ev("dead", 0), ev("applied", 1)])
        yield DeadLetterRow(dead, "handler-error: boom")

    run(inbox.store, program)
    # Redelivered as it was: both are duplicates
    assert claim(inbox.store, ev("dead", 0), ev("applied", 1)) == []
    # Replayed (kinbox dlq replay): the dead-lettered one is fresh again, once
    replay = (ev("dead", 10), ev("applied", 11))
    assert claim(inbox.store, *replay, reclaim=["dead", "applied"]) == [("dead", 10)]
    assert inbox.row("dead") == Row("applied", None, 10)
    assert inbox.row("applied") == Row("applied", None, 1)
    assert claim(inbox.store, *replay, reclaim=["dead", "applied"]) == []


def claimed_and_reused(store: InboxStore, *events: Event) -> list[tuple[str, int, int]]:
    """Claim ``events``, then check the duplicates for reuse; the sightings as (id, at, first)."""

    def program(_tx: Seen) -> Steps[list[Sighting]]:
        fresh: list[Event] = yield Claim(list(events))
        found: list[Sighting] = yield CheckReused([e for e in events if e not in fresh])
        return found

    return [(s.event.id, s.event.offset, s.first_offset) for s in store.run(program)]


def test_a_duplicate_with_another_payload_is_a_sighting_once_per_record(inbox: StoreSide) -> None:
    claim(inbox.store, ev("a", 0, b"1"), ev("b", 1, b"1"))
    # Given duplicates of a and b (b's payload differs) and a repeat of c within the claim
    again = (ev("a", 5, b"1"), ev("b", 6, b"2"), ev("c", 7, b"1"), ev("c", 8, b"3"))
    assert claimed_and_reused(inbox.store, *again) == [("b", 6, 1), ("c", 8, 7)]
    # Then the rows are the first deliveries', and the same records again are not new
    assert (inbox.row("b"), inbox.row("c")) == (Row("applied", None, 1), Row("applied", None, 7))
    assert claimed_and_reused(inbox.store, *again) == []
    # Another record reusing b is new
    assert claimed_and_reused(inbox.store, ev("b", 9, b"3")) == [("b", 9, 1)]
    assert claimed_and_reused(inbox.other_consumer(), ev("b", 9, b"3")) == []  # fresh there


def test_a_rolled_back_sighting_is_forgotten(inbox: StoreSide) -> None:
    claim(inbox.store, ev("a", 0, b"1"))

    def program() -> Steps[None]:
        yield Claim([ev("a", 3, b"2")])
        assert len((yield CheckReused([ev("a", 3, b"2")]))) == 1
        raise RuntimeError("the batch failed")

    with pytest.raises(RuntimeError):
        run(inbox.store, program)
    assert claimed_and_reused(inbox.store, ev("a", 3, b"2")) == [("a", 3, 0)]


REASONS = {
    "plain": "handler-error: ValueError: no such customer",
    "non-ascii": "handler-error: café 日本",
    "nul": "handler-error: bad byte \x00 in payload",
    "lone-surrogate": "handler-error: " + b"caf\xe9".decode("utf-8", "surrogateescape"),
    "long": "handler-error: " + "x" * 1_000_000,
}


@pytest.mark.parametrize("name", sorted(REASONS))
def test_dead_letter_records_any_reason_as_storable_text(inbox: StoreSide, name: str) -> None:
    reason = REASONS[name]

    def program() -> Steps[None]:
        [event] = yield Claim([ev("bad", 3)])
        yield DeadLetterRow(event, reason)

    run(inbox.store, program)
    row = inbox.row("bad")
    assert row == Row("dead_lettered", storable(reason, "UTF8"), 3)
    assert row.reason is not None and len(row.reason.encode()) <= 1000
    assert row.reason.startswith("handler-error: ")


def test_a_dead_letter_goes_with_its_rolled_back_transaction(inbox: StoreSide) -> None:
    claim(inbox.store, ev("kept"))

    def program() -> Steps[None]:
        [event] = yield Claim([ev("bad", 1)])
        yield DeadLetterRow(event, "handler-error")
        raise RuntimeError("the dead letter's publish failed")

    with pytest.raises(RuntimeError):
        run(inbox.store, program)
    assert inbox.row("bad") is None and inbox.row("kept") == Row("applied", None, 0)


@pytest.mark.parametrize("alone", [False, True], ids=["among-others", "alone"])
@pytest.mark.parametrize("event_id", ["nul\x00id", "lone\udcffsurrogate"], ids=["nul", "surrogate"])
def test_an_id_the_driver_cannot_send_is_refused_and_the_transaction_goes_on(
    inbox: StoreSide, event_id: str, alone: bool
) -> None:
    # (A claim of one event sends plain values, of several array literals.)
    def program() -> Steps[None]:
        with pytest.raises(StoreError) as refused:
            yield Claim([ev(event_id, 1)] if alone else [ev("a"), ev(event_id, 1)])
        assert not refused.value.transient
        # refused before anything was sent: the transaction is still usable
        assert [e.id for e in (yield Claim([ev("a")]))] == ["a"]

    run(inbox.store, program)
    assert inbox.row("a") == Row("applied", None, 0)


def test_a_savepoint_undoes_its_own_work_only(inbox: StoreSide) -> None:
    def program() -> Steps[None]:
        yield Claim([ev("a"), ev("b", 1), ev("c", 2), ev("d", 3)])
        yield inbox.call("a", guard="savepoint")
        with pytest.raises(RuntimeError, match="handler failed"):
            yield inbox.call("b", FAIL, guard="savepoint")
        with pytest.raises(StoreError) as refused:
            yield inbox.call("c", REFUSED, guard="savepoint")
        assert not refused.value.transient and "DivisionByZero" in str(refused.value)
        yield inbox.call("d")

    run(inbox.store, program)
    assert inbox.effects() == ["a", "d"]
    assert [inbox.row(i) for i in "abcd"] == [Row("applied", None, o) for o in range(4)]


def test_a_savepoint_whose_block_swallowed_a_database_error_blames_that_block(
    inbox: StoreSide,
) -> None:
    # Given a handler that catches a refused statement and returns normally
    def program() -> Steps[None]:
        yield Claim([ev("swallow"), ev("next", 1)])
        with pytest.raises(StoreError, match="left the transaction aborted") as blamed:
            yield inbox.call("swallow", SWALLOWED, guard="savepoint")
        assert not blamed.value.transient
        # Then its work is rolled back, and the next event's savepoint works
        yield inbox.call("next", guard="savepoint")

    run(inbox.store, program)
    assert inbox.effects() == ["next"]


def test_unguarded_translates_a_refused_statement(inbox: StoreSide) -> None:
    def program() -> Steps[None]:
        yield Claim([ev("a")])
        yield inbox.call(REFUSED)

    with pytest.raises(StoreError) as refused:
        run(inbox.store, program)
    assert not refused.value.transient
    assert inbox.row("a") is None


def test_unguarded_blames_a_block_that_left_the_transaction_aborted(inbox: StoreSide) -> None:
    def program() -> Steps[None]:
        yield Claim([ev("a")])
        yield inbox.call("a", SWALLOWED)

    with pytest.raises(StoreError, match="left the transaction aborted") as blamed:
        run(inbox.store, program)
    assert not blamed.value.transient
    assert inbox.row("a") is None and inbox.effects() == []


def test_an_aborted_transaction_refuses_kinbox_statements_and_commits_nothing(
    inbox: StoreSide,
) -> None:
    def program() -> Steps[None]:
        [event] = yield Claim([ev("a")])
        with pytest.raises(StoreError, match="left the transaction aborted"):
            yield inbox.call("a", SWALLOWED)  # blamed, and the blame ignored
        for step in (Claim([ev("b", 1)]), DeadLetterRow(event, "x")):
            with pytest.raises(StoreError, match="InFailedSqlTransaction") as refused:
                yield step
            assert not refused.value.transient
        # Returning normally: PostgreSQL would answer this COMMIT with a
        # ROLLBACK, and psycopg would raise nothing; the store raises.

    with pytest.raises(StoreError) as at_commit:
        run(inbox.store, program)
    assert not at_commit.value.transient
    assert "COMMIT of an aborted transaction" in str(at_commit.value)
    assert inbox.row("a") is None and inbox.effects() == []
    # and the store works again afterwards
    assert claim(inbox.store, ev("a")) == [("a", 0)]


def test_outage_tells_a_database_outage_from_the_events_fault(inbox: StoreSide) -> None:
    # A content error: the event's fault, not an outage
    def content(tx: Seen) -> Steps[None]:
        yield Claim([ev("a")])
        for guard in GUARDS:
            with pytest.raises(StoreError) as refused:
                yield inbox.call(REFUSED, guard=guard)
            assert tx.outage(refused.value) is None and tx.conflict(refused.value) is None
            assert tx.outage(refused.value.__cause__ or refused.value) is None
        assert tx.outage(RuntimeError("wrapped")) is None
        # The same error caught: what the handler's next statement meets is its own too
        with pytest.raises(StoreError) as next_one:
            yield inbox.call("a")
        assert tx.outage(next_one.value) is None and tx.conflict(next_one.value) is None

    with pytest.raises(StoreError, match="COMMIT of an aborted"):
        inbox.store.run(content)

    # The connection goes away under a handler: an outage, also when wrapped
    def outage(tx: Seen) -> Steps[None]:
        yield Claim([ev("b", 1)])
        try:
            yield inbox.call(OUTAGE)
        except Exception as exc:
            wrapped = RuntimeError("the handler wrapped it")
            wrapped.__cause__ = exc
            for raised in (exc, wrapped):
                found = tx.outage(raised)
                assert found is not None and found.transient, raised
            raise
        pytest.fail("no outage")

    with pytest.raises((StoreError, psycopg.Error)):
        inbox.store.run(outage)
    # and the store works again afterwards, with nothing of that transaction kept
    assert inbox.row("b") is None
    assert claim(inbox.store, ev("b", 1)) == [("b", 1)]


def test_an_ambiguous_commit_happened_and_its_claims_are_found_next_time(
    inbox: StoreSide,
) -> None:
    # Given a COMMIT that takes effect but whose answer never reaches the client
    def program() -> Steps[None]:
        yield Claim([ev("a", 0), ev("b", 1)])
        yield inbox.call("a")

    with inbox.answer_lost(), pytest.raises(StoreError) as lost:
        run(inbox.store, program)
    # Then the client sees a transient error (the batch will be retried) ...
    assert lost.value.transient, lost.value
    # ... and the retry finds the ids recorded: the effect is not applied twice
    assert claim(inbox.store, ev("a", 0), ev("b", 1), ev("c", 2)) == [("c", 2)]
    assert inbox.row("a") == Row("applied", None, 0) and inbox.effects() == ["a"]
