"""The batches in flight: each ended batch collected once, by the turn or by a revoke's wait."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from kinbox.consume import inflight
from kinbox.consume.inflight import InFlight
from kinbox.core.outcome import BatchResult

pytestmark = pytest.mark.unit

A, B = ("t", 0), ("t", 1)


@pytest.fixture
def flight() -> Iterator[InFlight]:
    """Batches in flight on two threads, shut down after the test."""
    running = InFlight(2)
    yield running
    running.shutdown()


def _held(result: int) -> tuple[threading.Event, Callable[[], BatchResult]]:
    """A batch that ends, with ``next_offset=result``, once its event is set."""
    go = threading.Event()

    def work() -> BatchResult:
        assert go.wait(10)
        return BatchResult(result)

    return go, work


def _ended(flight: InFlight, count: int) -> list[tuple[tuple[str, int], int | None]]:
    """What the turns collect until ``count`` batches ended (as the polling loop waits)."""
    out: list[tuple[tuple[str, int], int | None]] = []
    for _ in range(1000):
        out += [(tp, future.result().next_offset) for tp, future in flight.finished()]
        if len(out) >= count:
            return out
        flight.wait(0.01)
    raise AssertionError(f"only {out} ended")


def test_each_batch_is_collected_once_by_a_turn_after_it_ended(flight: InFlight) -> None:
    go_a, work_a = _held(10)
    go_b, work_b = _held(20)
    flight.submit(A, work_a)
    flight.submit(B, work_b)
    assert flight.finished() == []
    go_b.set()
    assert _ended(flight, 1) == [(B, 20)]
    go_a.set()
    assert _ended(flight, 1) == [(A, 10)]
    assert flight.finished() == [] and len(flight) == 0


def test_a_batch_collected_by_a_revoke_is_not_collected_again_nor_taken_for_the_next(
    flight: InFlight,
) -> None:
    go, work = _held(10)
    flight.submit(A, work)
    go.set()
    assert [(tp, f.result().next_offset) for tp, f in flight.wait_for([A], 10)] == [(A, 10)]
    # The partition's next batch, running: the old one's end is not its end
    go_next, work_next = _held(11)
    flight.submit(A, work_next)
    assert flight.finished() == [] and A in flight
    go_next.set()
    assert _ended(flight, 1) == [(A, 11)]


def test_drain_returns_every_batch_that_ended_in_time_and_orphans_the_rest(
    flight: InFlight,
) -> None:
    go_a, work_a = _held(10)
    go_b, work_b = _held(20)
    flight.submit(A, work_a)
    flight.submit(B, work_b)
    go_a.set()
    assert [(tp, f.result().next_offset) for tp, f in flight.drain(0.5)] == [(A, 10)]
    assert flight.unfinished() == 1
    go_b.set()
    flight.wait(10)  # until the orphan ended
    assert flight.finished() == [] and len(flight) == 0  # its result dropped


def test_a_batchs_label_is_made_only_when_a_report_needs_it(
    flight: InFlight, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    made: list[str] = []

    def label() -> str:
        made.append("t[0]@5..7")
        return made[-1]

    go, work = _held(8)
    flight.submit(A, work, label)
    flight.report_stuck()
    assert made == []
    monkeypatch.setattr(inflight, "STUCK_AFTER", 0.0)
    flight.report_stuck()
    assert made == ["t[0]@5..7"]
    assert "the batch of t[0]@5..7 has been running" in caplog.text
    go.set()
    assert _ended(flight, 1) == [(A, 8)]
