"""The fault suite's scoreboard: what every scenario's rounds measured, printed after the session.

A round adds what it measured (delivery logs of the worker processes, rows
counted in the database, offsets read back from the broker) to its
scenario's row; a round that failed counts under ``fail`` and is named under
the table with what replays it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.support.invariants import Outcome
from tests.support.scenario import SEED, long_mode, replay_hint

LEGEND = (
    "runs: rounds run; produced: records written (duplicates included); deliver: records the "
    "workers received (delivery logs); once: events with exactly one effect row; dups-supp: "
    "deliveries the inbox suppressed (kinbox's batch results); dlq: dead_lettered rows in "
    "processed_events / records on the dead-letter topic; lost/twice: events with "
    "0 / >1 effect rows."
)


@dataclass
class Row:
    """One scoreboard line: a scenario (one case of it) summed over its rounds."""

    scenario: str
    fault: str
    runs: int = 0
    failed: int = 0
    produced: int = 0
    deliveries: int = 0
    applied_once: int = 0
    duplicates_suppressed: int = 0
    dead_lettered: int = 0
    dead_letters: int = 0
    lost: int = 0
    applied_twice: int = 0
    seconds: float = 0.0
    failed_rounds: list[str] = field(default_factory=list)
    """Test ids of the rounds that failed."""

    def add(self, outcome: Outcome | None, seconds: float, test_id: str, ok: bool) -> None:
        """Count one round (``outcome`` is ``None`` if it failed before measuring)."""
        self.runs += 1
        self.seconds += seconds
        if not ok:
            self.failed += 1
            self.failed_rounds.append(test_id)
        if outcome is not None:
            self.produced += outcome.produced
            self.deliveries += outcome.deliveries
            self.applied_once += outcome.applied_once
            self.duplicates_suppressed += outcome.duplicates_suppressed
            self.dead_lettered += outcome.dead_lettered
            self.dead_letters += len(outcome.dead_letters)
            self.lost += len(outcome.lost)
            self.applied_twice += len(outcome.applied_twice)

    def line(self) -> str:
        """The row as printed under :data:`HEADER`."""
        return (
            f"{self.scenario[:34]:<34} {self.fault[:30]:<30} {self.runs:>4} {self.failed:>4} "
            f"{self.produced:>8} {self.deliveries:>7} {self.applied_once:>6} "
            f"{self.duplicates_suppressed:>9} {f'{self.dead_lettered}/{self.dead_letters}':>7} "
            f"{self.lost:>4} {self.applied_twice:>5} {self.seconds:>6.1f}"
        )


HEADER = (
    f"{'scenario':<34} {'fault':<30} {'runs':>4} {'fail':>4} {'produced':>8} "
    f"{'deliver':>7} {'once':>6} {'dups-supp':>9} {'dlq':>7} {'lost':>4} {'twice':>5} "
    f"{'secs':>6}"
)

SCOREBOARD: dict[str, Row] = {}
"""Scenario name -> its row, in the order the scenarios first ran."""


def score(name: str, fault: str, outcome: Outcome | None, seconds: float, test_id: str,
          ok: bool) -> None:  # fmt: skip
    """Add one round of scenario ``name`` to the scoreboard."""
    SCOREBOARD.setdefault(name, Row(name, fault)).add(outcome, seconds, test_id, ok)


def write(tr: pytest.TerminalReporter) -> None:
    """Print the scoreboard (nothing if no scenario ran)."""
    if not SCOREBOARD:
        return
    tr.section(f"kinbox fault scoreboard (seed {SEED}, {'long' if long_mode() else 'quick'} mode)")
    tr.write_line(HEADER)
    tr.write_line("-" * len(HEADER))
    for row in SCOREBOARD.values():
        tr.write_line(row.line())
    tr.write_line(LEGEND)
    failed = [test_id for row in SCOREBOARD.values() for test_id in row.failed_rounds]
    for test_id in failed:
        tr.write_line(f"failed round, replay alone: {replay_hint()} pytest '{test_id}'")
    if not failed:
        tr.write_line(f"replay: {replay_hint()} pytest tests/faults")
