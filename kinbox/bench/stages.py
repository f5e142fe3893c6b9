"""Where an event's latency goes: its stages, from the producer's clock to the offset commit.

Each sampled event of an outside latency run has a time for every stage it
passed, from four sources on one machine's clock (the database's is moved
onto it, :func:`kinbox.bench.effects.clock_offset`)::

    produced      the feeder called produce()           (the payload's sentAt)
    appended      the broker appended it                (LogAppendTime, the feeder's acks)
    fetched       the worker's poll returned it         (the worker's stage stamps,
    batch         its batch began                        KINBOX_STAGE_STAMPS:
    handler       the handler was called with it         kinbox.ops.stamps)
    inserted      the handler's INSERT ran              (the effect row's clock_timestamp())
    committed     its transaction committed             (pg_xact_commit_timestamp)
    commit        COMMIT returned to the worker         (stage stamps)
    offset-sent   an offset past it went to the broker  (stage stamps)
    offset-acked  the broker confirmed it               (stage stamps)

:func:`split` gives, per stage, the time from the stage before it and from
``produced``, p50 and p99 over the events that have both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kinbox.bench.results import percentiles

ORDER = (
    "produced", "appended", "fetched", "batch", "handler", "inserted", "committed", "commit",
    "offset-sent", "offset-acked",
)  # fmt: skip
"""Every stage, in the order an event passes them."""

Key = tuple[int, int]
"""``(partition, offset)``."""


@dataclass(frozen=True)
class Leg:
    """One stage: how long after the stage before it, and after ``produced``, in ms."""

    stage: str
    after: str
    samples: int
    p50_ms: float
    p99_ms: float
    total_p50_ms: float
    total_p99_ms: float


def read_stamps(path: Path, topic: str) -> dict[str, dict[Key, float]]:
    """The stage stamps of ``topic`` in a worker's stamps file (the first of each, per event)."""
    found: dict[str, dict[Key, float]] = {}
    if not path.exists():
        return found
    with path.open() as lines:
        for line in lines:
            parts = line.split()
            if len(parts) != 5 or parts[1] != topic:
                continue
            stage, _, partition, offset, when = parts
            found.setdefault(stage, {}).setdefault((int(partition), int(offset)), float(when))
    return found


def read_appended(path: Path) -> dict[Key, float]:
    """The broker's append times in a feeder's acknowledgements file (none if not known)."""
    found: dict[Key, float] = {}
    if not path.exists():
        return found
    with path.open() as lines:
        for line in lines:
            partition, offset, appended = line.split()
            if float(appended) >= 0:
                found[(int(partition), int(offset))] = float(appended)
    return found


def split(times: Mapping[str, Mapping[Key, float]], sample: Iterable[Key]) -> list[Leg]:
    """Per stage present in ``times``, its leg over the events of ``sample`` that passed it.

    A stage's leg runs from the nearest earlier stage the event also has a
    time for, so a stage missing for a contender (the hand-written consumer
    has no stamps) is skipped rather than breaking the chain.
    """
    keys = list(sample)
    legs = []
    present = [s for s in ORDER if times.get(s)]
    for index, stage in enumerate(present[1:], start=1):
        mine = times[stage]
        step: list[float] = []
        total: list[float] = []
        before = present[index - 1]
        for key in keys:
            at = mine.get(key)
            start = times[present[0]].get(key)
            previous = times[before].get(key)
            if at is None or start is None or previous is None:
                continue
            step.append(1000 * (at - previous))
            total.append(1000 * (at - start))
        if len(step) < 2:
            continue
        p50, p99 = percentiles(step)
        t50, t99 = percentiles(total)
        legs.append(Leg(stage, before, len(step), p50, p99, t50, t99))
    return legs
