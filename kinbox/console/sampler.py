"""The console's own sampling: a snapshot every few seconds, the last hour kept for the charts.

A worker's metrics (``--metrics-port``) are per process and need a scraper
to become a history; the console asks the broker and the database itself,
so the charts work wherever the console can reach them, with nothing else
deployed. Each sample keeps three figures: the lag over every group, the
rows applied a second and the rows dead-lettered a second (both counted in
``processed_events`` over the sampling interval). An hour of samples is kept
in memory; a restarted console starts its charts afresh.

The blocking reads run on a worker thread, so pages are served meanwhile;
a failed read is logged and the loop goes on (the snapshot says what failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kinbox.console.overview import Overview

log = logging.getLogger(__name__)

HOUR = 3600.0


@dataclass(frozen=True)
class Sample:
    """The figures of one snapshot that the charts draw."""

    at: float
    """Seconds since the epoch."""
    lag: int
    applied: float
    """Rows applied a second."""
    dead: float
    """Rows dead-lettered a second."""


class Sampler:
    """Takes a snapshot every ``every`` seconds and keeps ``keep`` seconds of samples.

    Args:
        take: reads a snapshot (blocking; run on a thread).
        every: seconds between two snapshots.
        keep: seconds of samples kept.
    """

    def __init__(self, take: Callable[[], Overview], every: float, keep: float = HOUR) -> None:
        self._take = take
        self.every = every
        self._samples: deque[Sample] = deque(maxlen=max(2, int(keep / every) + 1))
        self.latest: Overview | None = None
        self._fresh = asyncio.Event()

    def series(self) -> list[Sample]:
        """The samples kept, oldest first."""
        return list(self._samples)

    def refresh(self) -> None:
        """Take the next snapshot now (after an action), not at the end of the interval."""
        self._fresh.set()

    async def sample(self) -> Overview:
        """Take one snapshot now and add its sample."""
        snapshot = await asyncio.to_thread(self._take)
        self.latest = snapshot
        if snapshot.status is not None:
            self._samples.append(
                Sample(
                    time.time(),
                    snapshot.lag,
                    snapshot.rate("applied"),
                    snapshot.rate("dead_lettered"),
                )
            )
        return snapshot

    async def run(self) -> None:
        """Sample until cancelled."""
        while True:
            try:
                await self.sample()
            except Exception:  # the loop must outlive any one failure
                log.exception("the console's sampler failed; trying again")
            self._fresh.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._fresh.wait(), self.every)
