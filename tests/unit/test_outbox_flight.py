"""Rows in flight: a key settles as a whole, and holds back only itself (no services)."""

from __future__ import annotations

import uuid

import pytest

from kinbox.core.publisher import ACKED, Outcome, Sending
from producer_outbox.flight import RowsInFlight
from producer_outbox.records import OutboxRow

pytestmark = pytest.mark.unit

TIMEOUT = Outcome("_MSG_TIMED_OUT: timed out", outage=True)


def _row(key: str | None, topic: str = "t", lane: int = 0, attempts: int = 0) -> OutboxRow:
    return OutboxRow(str(uuid.uuid4()), 1, topic, key, None, b"{}", {}, attempts, lane=lane)


def test_a_key_settles_once_each_of_its_rows_has_its_outcome_and_alone() -> None:
    # Given one send of rows of keys a (twice), b, and a keyless row
    flights = RowsInFlight()
    rows = [_row("a", lane=1), _row("b", lane=2), _row("a", topic="u", lane=1), _row(None, lane=3)]
    sending = Sending(len(rows))
    flights.add(rows, sending, epoch=1, started=0.0)
    assert flights.busy_keys() == {"a", "b"} and flights.busy_ids() == {rows[3].id}
    assert flights.lanes() == {1, 2, 3} and flights.rows == 4
    # When b, the keyless row and the first row of a are acknowledged
    for index in (1, 3, 0):
        sending.settle(index, ACKED)
    # Then b and the keyless row settle; a waits for its second row
    [settled] = flights.take_settled()
    assert [r.id for r in settled.rows] == [rows[1].id, rows[3].id]
    # (a counts as in flight with both its rows until it settles; the rows of
    # a topic left out by `but` do not)
    assert flights.count() == 2 and flights.count(but={"u"}) == 1
    flights.release([settled])
    assert flights.busy_keys() == {"a"} and flights.busy_ids() == set()
    assert flights.lanes() == {1}
    # When a's second row times out, a settles with both its rows, in claim order
    sending.settle(2, TIMEOUT)
    [settled] = flights.take_settled()
    assert [r.id for r in settled.rows] == [rows[0].id, rows[2].id]
    assert settled.outcomes == [ACKED, TIMEOUT]
    assert flights.busy_keys() == {"a"}, "held until it is marked and released"
    flights.release([settled])
    assert flights.busy_keys() == set() and flights.lanes() == set() and flights.rows == 0
    assert flights.take_settled() == []


def test_a_row_that_waits_for_its_topics_slot_holds_its_key_until_the_slot_frees() -> None:
    flights = RowsInFlight()
    alone, waiting = _row("a", attempts=1), _row("b", attempts=1)
    keyless = _row(None, attempts=1)
    sending = Sending(1)
    flights.add([alone], sending, epoch=1, started=0.0, alone=True)
    flights.wait(waiting)
    flights.wait(keyless)
    assert flights.alone_topics() == {"t"}
    assert flights.busy_keys() == {"a", "b"} and flights.busy_ids() == {keyless.id}
    sending.settle(0, Outcome("MSG_SIZE_TOO_LARGE: too big"))
    flights.release(flights.take_settled())
    assert flights.alone_topics() == set()
    assert flights.busy_keys() == set() and flights.busy_ids() == set()


def test_a_topic_is_slow_while_a_row_sent_before_the_mark_has_no_outcome() -> None:
    flights = RowsInFlight()
    old, new = Sending(1), Sending(1)
    flights.add([_row("a", topic="stuck")], old, epoch=1, started=1.0)
    flights.add([_row("b", topic="fine")], new, epoch=1, started=5.0)
    assert flights.slow_topics(sent_before=4.0) == {"stuck"}
    old.settle(0, TIMEOUT)
    assert flights.slow_topics(sent_before=4.0) == set()
