"""The ``kinbox.consumer.lag`` gauge: every running worker's lag board, read on demand.

The SDK keeps one instrument per name and meter and ignores the callback of
a second registration, so the workers of one process (tests run many, one
after another) share one gauge per meter, whose callback reads each board
registered with it. The boards are held weakly by their owners, so a worker
that is gone stops being reported even if it never said so.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

from opentelemetry import metrics
from opentelemetry.metrics import Observation

from kinbox.middleware import semconv as sc
from kinbox.middleware.instruments import gauge

if TYPE_CHECKING:
    from kinbox.consume.lag import LagBoard


class LagGauge:
    """``kinbox.consumer.lag`` of one meter (labels ``group``, ``topic``, ``partition``)."""

    def __init__(self, meter: metrics.Meter) -> None:
        self._lock = threading.Lock()
        self._boards: weakref.WeakKeyDictionary[object, tuple[str, LagBoard]] = (
            weakref.WeakKeyDictionary()
        )
        gauge(meter, sc.CONSUMER_LAG, self._observe)

    def watch(self, owner: object, group: str, board: LagBoard) -> None:
        """Report ``board`` as ``group``'s until ``owner`` is forgotten or collected."""
        with self._lock:
            self._boards[owner] = (group, board)

    def forget(self, owner: object) -> None:
        """Stop reporting ``owner``'s board."""
        with self._lock:
            self._boards.pop(owner, None)

    def _observe(self) -> Iterator[Observation]:
        with self._lock:
            boards = list(self._boards.values())
        for group, board in boards:
            for (topic, partition), lag in sorted(board.read().items()):
                yield Observation(
                    lag, {sc.GROUP: group, sc.TOPIC: topic, sc.PARTITION_LABEL: str(partition)}
                )


_GAUGES: weakref.WeakKeyDictionary[metrics.Meter, LagGauge] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def lag_gauge(meter: metrics.Meter) -> LagGauge:
    """The lag gauge of ``meter``, made on first use."""
    with _LOCK:
        found = _GAUGES.get(meter)
        if found is None:
            found = _GAUGES[meter] = LagGauge(meter)
        return found
