"""Watching a run from outside: the group's committed offsets, sampled on a clock.

Every contender commits an offset only after the database work below it is
committed, so the committed offsets are a progress measure they all share
and none of them can flatter: records are *done* when their offset is
committed. A run's throughput is the slope of that progress between the
first sample that shows any (so the group join and the first fetch, which
vary by framework and cluster, are left out) and the sample that shows the
end::

    rate = (records done at the end - records done at the first sample)
           / (time of the end sample - time of the first sample)

Both ends are observed with the same sampling delay, so it cancels.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, TopicPartition

from kinbox.bench.spec import Target
from kinbox.core.errors import KinboxError
from kinbox.kafka.errors import translate

INTERVAL = 0.02
"""Seconds between samples."""


class Stuck(KinboxError):
    """The run did not reach the end of its topic in time."""


@dataclass
class Progress:
    """Samples of one group's committed offsets on one topic."""

    target: Target
    group: str
    topic: str
    ends: Mapping[int, int]
    start: Mapping[int, int] = field(default_factory=dict)
    """Committed offsets before the run (a replay starts from a reset, not from zero)."""
    first: tuple[float, int] | None = None
    last: tuple[float, int] | None = None

    def __post_init__(self) -> None:
        self._consumer = Consumer(
            {**self.target.client_config(consumer=True), "group.id": self.group,
             "enable.auto.commit": False}
        )  # fmt: skip
        self._parts = [TopicPartition(self.topic, p) for p in sorted(self.ends)]
        self.total = sum(self.ends[p] - self.start.get(p, 0) for p in self.ends)

    def committed(self, timeout: float = 30.0) -> dict[int, int]:
        """The group's committed offsets now (0 for a partition without one).

        A retriable refusal is asked again, for up to ``timeout`` seconds: a
        busy broker answers NOT_COORDINATOR (or times out) while it moves or
        loads a new group's coordinator, and that is no failure of the run.

        Raises:
            TransportError: the broker refused for good, or kept refusing.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                parts = self._consumer.committed(self._parts, timeout=10)
            except KafkaException as exc:
                error = translate(f"reading committed offsets of {self.group!r}", exc)
                if not error.retriable or time.monotonic() > deadline:
                    raise error from exc
                time.sleep(INTERVAL * 10)
                continue
            return {tp.partition: max(tp.offset, 0) for tp in parts}

    def sample(self) -> int:
        """Record one sample; return the records done so far."""
        now = time.monotonic()
        got = self.committed()
        done = sum(max(0, got.get(p, 0) - self.start.get(p, 0)) for p in self.ends)
        if done and self.first is None:
            self.first = (now, done)
        self.last = (now, done)
        return done

    @property
    def finished(self) -> bool:
        """Whether the last sample showed every partition at its end."""
        return self.last is not None and self.last[1] >= self.total

    def wait(
        self,
        timeout: float,
        on_sample: Callable[[float], None] = lambda _fraction: None,
        alive: Callable[[], bool] = lambda: True,
    ) -> None:
        """Sample until the end; ``on_sample`` gets the fraction done after each sample.

        Raises:
            Stuck: ``timeout`` passed, or ``alive()`` turned false, first.
        """
        deadline = time.monotonic() + timeout
        while True:
            done = self.sample()
            on_sample(done / self.total if self.total else 1.0)
            if self.finished:
                return
            if not alive():
                raise Stuck(f"{self.group}: the consumer exited at {done}/{self.total} records")
            if time.monotonic() > deadline:
                raise Stuck(
                    f"{self.group}: {done}/{self.total} records committed after {timeout:.0f}s"
                )
            time.sleep(INTERVAL)

    def rate(self) -> float | None:
        """Records per second between the first and the last sample (see the module doc).

        ``None`` when the run was over before a second sample could see
        progress (a run too short to time, as in the quick mode).
        """
        if self.first is None or self.last is None or self.last[1] <= self.first[1]:
            return None
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])

    def close(self) -> None:
        """Release the client (it never joined the group)."""
        self._consumer.close()
