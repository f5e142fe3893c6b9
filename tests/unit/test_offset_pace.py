"""Offset commits follow the broker's pace: one asynchronous commit in flight at a time."""

from __future__ import annotations

import pytest

from kinbox.consume.offsets import ANSWER_WAIT, Offsets
from kinbox.core.errors import TransportError
from kinbox.testing import FakeTransport, record
from tests.unit.test_offset_markers import Heard

pytestmark = pytest.mark.unit

T = "payments"
P0, P1 = (T, 0), (T, 1)


def _consumed() -> tuple[FakeTransport, Heard]:
    transport = FakeTransport(
        {tp: [record(T, tp[1], o, f"e{o}") for o in range(9)] for tp in (P0, P1)}
    )
    heard = Heard()
    transport.subscribe([T], heard)
    transport.poll(100, 0)
    return transport, heard


def test_the_next_commit_waits_for_the_answer_and_carries_the_latest_offsets() -> None:
    transport, heard = _consumed()
    offsets = heard.offsets = Offsets(transport)
    # Given a commit on its way
    offsets.advance(P0, 1)
    offsets.commit()
    assert transport.commit_calls == [{P0: 1}]
    # When batches settle before the broker has answered, nothing more is sent
    offsets.advance(P0, 2)
    offsets.advance(P1, 5)
    offsets.commit()
    offsets.advance(P0, 3)
    offsets.commit()
    assert transport.commit_calls == [{P0: 1}]
    # Then once the answer came, one commit carries every latest offset
    transport.poll(100, 0)
    offsets.commit()
    assert transport.commit_calls == [{P0: 1}, {P0: 3, P1: 5}]
    assert transport.committed == {P0: 3, P1: 5}


def test_an_answer_that_never_comes_does_not_stop_the_commits() -> None:
    transport, _ = _consumed()  # its listener never tells the offsets
    now = [0.0]
    offsets = Offsets(transport, clock=lambda: now[0])
    offsets.advance(P0, 1)
    offsets.commit()
    offsets.advance(P0, 4)
    now[0] += ANSWER_WAIT - 1
    offsets.commit()
    assert transport.commit_calls == [{P0: 1}]
    now[0] += 1
    offsets.commit()
    assert transport.commit_calls == [{P0: 1}, {P0: 4}]


def test_a_failed_answer_frees_the_way_and_the_offset_is_sent_again() -> None:
    transport, heard = _consumed()
    offsets = heard.offsets = Offsets(transport)
    transport.commit_errors.append(TransportError("coordinator moving", retriable=True))
    offsets.advance(P1, 2)
    offsets.commit()
    transport.poll(100, 0)  # the answer: failed
    offsets.commit()
    assert transport.commit_calls == [{P1: 2}, {P1: 2}] and transport.committed == {P1: 2}
