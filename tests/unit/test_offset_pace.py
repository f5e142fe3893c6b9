"""Offset commits follow the broker's pace: one asynchronous commit in flight at a time,
and the next goes out as soon as its answer is served."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from kinbox.consume.offsets import ANSWER_WAIT, Offsets
from kinbox.consume.runner import ANSWER_WAIT_SLICE
from kinbox.core.config import Settings
from kinbox.core.errors import TransportError
from kinbox.core.record import Record
from kinbox.testing import FakeTransport, record
from tests.unit.test_offset_markers import Heard, subscribed_runner

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


def test_offsets_settled_behind_a_commit_in_flight_are_queued_until_its_answer() -> None:
    transport, heard = _consumed()
    offsets = heard.offsets = Offsets(transport)
    assert not offsets.queued()
    offsets.advance(P0, 1)
    assert not offsets.queued()  # nothing in flight: the turn's commit sends it
    offsets.commit()
    assert not offsets.queued()  # in flight, nothing newer
    offsets.advance(P1, 4)
    assert offsets.queued()
    transport.poll(100, 0)  # the answer
    assert not offsets.queued()


class _SlowAnswers(FakeTransport):
    """A fake whose commit answers wait until released, and which records each poll's wait."""

    def __init__(self, logs: dict[tuple[str, int], list[Record]]) -> None:
        super().__init__(logs)
        self.waits: list[float] = []
        self.held: list[tuple[dict[tuple[str, int], int], None]] = []

    def commit(self, offsets: Mapping[tuple[str, int], int], *, asynchronous: bool = False) -> None:
        super().commit(offsets, asynchronous=asynchronous)
        if asynchronous:  # keep the answer back from the next poll
            self.held.append((dict(offsets), None))
            self._answers.pop()

    def poll(self, max_messages: int, timeout: float) -> list[Record]:
        self.waits.append(timeout)
        return super().poll(max_messages, timeout)


def test_an_idle_poll_waits_briefly_while_settled_offsets_queue_behind_a_commit() -> None:
    transport = _SlowAnswers({P0: [record(T, 0, o, f"e{o}") for o in range(3)]})
    runner = subscribed_runner(transport)
    wait = Settings(database_url="postgresql:///x", group_id="g").validate().batch_max_wait
    runner.turn()  # 0..2 applied, their commit sent, its answer held back
    assert transport.commit_calls == [{P0: 3}]
    runner.turn()  # idle, nothing queued behind the commit: the usual wait
    assert transport.waits[-1] == wait
    # Given records settled while the commit is still unanswered
    transport.logs[P0].extend(record(T, 0, o, f"e{o}") for o in range(3, 5))
    runner.turn()
    assert transport.commit_calls == [{P0: 3}]
    # Then the idle poll waits only a slice, so the answer is served soon
    runner.turn()
    assert transport.waits[-1] == ANSWER_WAIT_SLICE < wait
    # And once it is, the next commit carries the queued offset
    transport._answers.extend(transport.held)
    runner.turn()
    assert transport.commit_calls == [{P0: 3}, {P0: 5}]
    runner.turn()
    transport._answers.extend(transport.held[1:])
    runner.turn()
    assert transport.waits[-1] == wait
