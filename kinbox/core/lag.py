"""Consumer lag per assigned partition, as the Kafka client last reported it.

The transport writes it (:mod:`kinbox.kafka.stats`: from librdkafka's
statistics, on the polling thread, every ``statistics.interval.ms``), the
telemetry reads it (an observable gauge, on the metric reader's thread). A
leaf with a lock: nothing on the hot path touches it, and neither side
imports the other.

Lag is the partition's end offset minus the group's committed offset: the
records this member has yet to apply *and commit*. A batch applied in the
database but not yet committed to Kafka still counts, so lag never reads
lower than what a restart would redeliver.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

Lags = Mapping[tuple[str, int], int]
"""Lag (records) by (topic, partition)."""


class LagBoard:
    """The latest lag of each partition assigned to one consumer; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lags: dict[tuple[str, int], int] = {}

    def update(self, lags: Lags) -> None:
        """Replace the board with ``lags``: a partition not in it is no longer assigned."""
        with self._lock:
            self._lags = dict(lags)

    def read(self) -> dict[tuple[str, int], int]:
        """A copy of the latest lags."""
        with self._lock:
            return dict(self._lags)
