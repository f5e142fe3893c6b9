"""What the redelivery check found: the scenarios, :class:`Difference`, the report, the failure.

A leaf of :mod:`kinbox.testing.redelivery`: plain data and how it reads in a
failed test's output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kinbox.core.errors import KinboxError
from kinbox.core.record import Position
from kinbox.testing.messages import Message
from kinbox.testing.snapshot import TableDifference

Scenario = Literal["duplicate", "crash", "transient", "lost-commit"]
SCENARIOS: tuple[Scenario, ...] = ("duplicate", "crash", "transient", "lost-commit")
"""What the check does to each event (all of them by default)."""

STORIES: Mapping[Scenario, str] = {
    "duplicate": "delivered again after every event (same id, new offset), twice in one batch",
    "crash": "the worker killed between the handler and COMMIT, then the record delivered again",
    "transient": "a transient database error after the handler ran, then the batch retried",
    "lost-commit": "COMMIT succeeded but its answer was lost, then the batch retried",
}
"""What each scenario does, in the words of a failure report."""


@dataclass(frozen=True)
class Difference:
    """Something that ends differently than after one clean delivery of each event.

    Attributes:
        scenario: the fault that made it differ; ``None`` if only all faults
            together did.
        message: the event the fault hit; ``None`` if only hitting every
            event did.
        where: that event's ``(topic, partition, offset)`` at its first delivery.
        table: the table that differs, and how.
        observed: ``(after the clean run, after the faults)`` of ``observe()``,
            when it is what differs.
    """

    scenario: Scenario | None
    message: Message | None
    where: Position | None
    table: TableDifference | None = None
    observed: tuple[object, object] | None = None

    def __str__(self) -> str:
        if self.message is None or self.where is None:
            who = "every event"
        else:
            topic, partition, offset = self.where
            who = f"event {self.message.id!r} ({topic}[{partition}]@{offset})"
        how = (
            f"{self.scenario}: {STORIES[self.scenario]}" if self.scenario else "every fault at once"
        )
        if self.table is not None:
            what = str(self.table).replace("\n", "\n  ")
        else:
            clean, faulty = self.observed or (None, None)
            what = f"observe() returns {faulty!r}, where one clean delivery gives {clean!r}"
        return f"{who}, {how}:\n  {what}"


@dataclass(frozen=True)
class RedeliveryReport:
    """What a passed check compared.

    Attributes:
        events: how many events were delivered per run.
        runs: the runs made (each in a fresh schema).
        faults: faults injected in the run with every fault.
        compared: the tables compared (kinbox's ``processed_events`` included).
        written: the tables the handler changed in a clean run.
        ignored: the columns left out, by table, and why.
    """

    events: int
    runs: int
    faults: int
    compared: tuple[str, ...]
    written: tuple[str, ...]
    ignored: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def __str__(self) -> str:
        return (
            f"{self.events} event(s), {self.runs} runs, {self.faults} faults injected; "
            + self.scope()
        )

    def scope(self) -> str:
        """What was compared, what the handler wrote and which columns were left out."""
        left_out = ", ".join(
            f"{table}.{column} ({why})"
            for table, columns in sorted(self.ignored.items())
            for column, why in columns.items()
        )
        return (
            f"compared {', '.join(self.compared)}; the handler wrote "
            f"{', '.join(self.written) or 'no table'}"
            + (f"; left out {left_out}" if left_out else "")
        )


class RedeliveryUnsafe(KinboxError, AssertionError):
    """A handler's effect is not the same when its events are redelivered.

    An ``AssertionError``, so test runners report a failed assertion.

    Attributes:
        differences: what differed, per event and fault.
    """

    def __init__(self, message: str, differences: Sequence[Difference]) -> None:
        super().__init__(message)
        self.differences = tuple(differences)


def explain(found: Sequence[Difference], report: RedeliveryReport, runs: int) -> str:
    """The failure message: every difference, then what was compared."""
    head = f"redelivery changes the handler's effect ({len(found)} difference(s), {runs} runs):"
    tail = f"({report.scope()})"
    return "\n".join([head, *(f"- {d}".replace("\n", "\n  ") for d in found), tail])
