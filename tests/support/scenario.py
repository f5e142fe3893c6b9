"""A fault scenario is a declaration; each of its seeded rounds is a test of its own.

A test of the fault suite declares what it is, and writes only its story::

    @scenario("1", "worker killed before commit", fault="SIGKILL before DB COMMIT")
    def test_sigkill_before_db_commit(run: Run) -> None:
        nth = run.rng.randint(1, 3)
        ...

tests/faults/conftest.py expands the declaration into rounds
(``test_sigkill_before_db_commit[1-round1]``, ``[1-round2]``...), gives each
round its ``run`` (:class:`tests.support.fault_run.Run`: its seed, topic,
schema, group and workers) and puts it on the scoreboard.

Seed
    ``KINBOX_FAULT_SEED`` replays a session; otherwise a random one is drawn.
    A round's random choices come from ``random.Random(f"{seed}:{test id}")``,
    so one round replays alone: the same seed, the same mode, its test id.
Modes
    quick (default): one round per scenario (``min_rounds`` if more).
    long (``KINBOX_FAULTS_LONG=1``, or ``pytest --long``): ``KINBOX_FAULTS_RUNS``
    rounds per scenario (default 5) and more events per round.
Cases
    variants of one scenario (the same story under three assignment
    protocols, say): ``cases={"eager": {"protocol": "eager"}, ...}``, each
    case id naming a scoreboard row and the case's arguments passed to the
    test by name. A scenario's variants are declared here, never with
    ``pytest.mark.parametrize``, so that every row of the scoreboard is one
    variant and every test id reads ``<scenario>-<case>-round<n>``.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

SEED_ENV = "KINBOX_FAULT_SEED"
LONG_ENV = "KINBOX_FAULTS_LONG"
RUNS_ENV = "KINBOX_FAULTS_RUNS"

SEED = os.environ.get(SEED_ENV) or str(random.SystemRandom().randrange(10**9))
"""This session's seed (printed with every round and under the scoreboard)."""

MARK = "scenario"
"""The marker :func:`scenario` puts on a test (registered by tests/faults/conftest.py)."""


def long_mode() -> bool:
    """Read when used, not at import: ``pytest --long`` sets the variable after this loads."""
    return os.environ.get(LONG_ENV, "").lower() in {"1", "true", "yes"}


def rounds_per_scenario() -> int:
    """Rounds of every scenario in this mode (a scenario may ask for more: ``min_rounds``)."""
    return int(os.environ.get(RUNS_ENV, "5")) if long_mode() else 1


def events_per_round() -> int:
    """Events a round produces when it does not say how many."""
    return 1000 if long_mode() else 300


def replay_hint() -> str:
    """The environment that replays this session's rounds (seed and mode)."""
    mode = f" {LONG_ENV}=1 {RUNS_ENV}={rounds_per_scenario()}" if long_mode() else ""
    return f"{SEED_ENV}={SEED}{mode}"


@dataclass(frozen=True)
class Scenario:
    """What a fault scenario is: its number, what it is called, and the fault it injects.

    Args:
        id: the scenario's number in the suite ("1", "7c"); first in its test ids.
        title: its scoreboard name after the id; with ``cases``, it says
            ``{case}`` where the case id goes.
        fault: what is done to the system, in a few words (scoreboard column);
            may say ``{case}`` too.
        partitions: of the round's own topic.
        min_rounds: rounds even in quick mode, for a scenario whose fault
            lands by chance (a race a single round may miss).
        cases: variants, case id -> the test's keyword arguments for it.
        long_only: run in long mode only (a scenario too slow for every
            ``make test``; quick mode reports it skipped, saying so).
    """

    id: str
    title: str
    fault: str
    partitions: int = 3
    min_rounds: int = 1
    cases: Mapping[str, Mapping[str, object]] = field(default_factory=dict, hash=False)
    long_only: bool = False

    def __post_init__(self) -> None:
        if not self.id or " " in self.id:
            raise ValueError(f"scenario id {self.id!r}: one word, like '7c'")
        if bool(self.cases) != ("{case}" in self.title):
            raise ValueError(
                f"scenario {self.id}: say {{case}} in the title if and only if it has cases"
            )
        if not self.cases and "{case}" in self.fault:
            raise ValueError(f"scenario {self.id}: {{case}} in the fault, but no cases")
        if len({frozenset(args) for args in self.cases.values()}) > 1:
            raise ValueError(f"scenario {self.id}: every case must give the same arguments")

    @property
    def arguments(self) -> tuple[str, ...]:
        """The names of the test arguments the cases fill in."""
        return tuple(next(iter(self.cases.values()), {}))

    def rounds(self) -> int:
        """How many rounds run this session."""
        return max(rounds_per_scenario(), self.min_rounds)

    def name(self, case: str | None) -> str:
        """The scoreboard row of ``case`` (``None``: the scenario has no cases)."""
        return f"{self.id} {self.title.format(case=case)}"

    def fault_of(self, case: str | None) -> str:
        """The fault column of ``case``."""
        return self.fault.format(case=case)

    def expand(self) -> list[Round]:
        """Every round of every case, in the order they run."""
        cases: list[str | None] = [*self.cases] or [None]
        return [Round(self, case, n) for case in cases for n in range(1, self.rounds() + 1)]


@dataclass(frozen=True)
class Round:
    """One seeded round of one case of a scenario (the ``fault_round`` parameter of a test)."""

    scenario: Scenario
    case: str | None
    number: int

    @property
    def id(self) -> str:
        """The test id's part for this round: ``7-eager-round2``."""
        parts = [self.scenario.id, self.case, f"round{self.number}"]
        return "-".join(part for part in parts if part)

    @property
    def name(self) -> str:
        """Its scoreboard row."""
        return self.scenario.name(self.case)

    @property
    def fault(self) -> str:
        """Its fault column."""
        return self.scenario.fault_of(self.case)

    @property
    def arguments(self) -> tuple[object, ...]:
        """The case's values of :attr:`Scenario.arguments`, in that order."""
        given = self.scenario.cases.get(self.case or "", {})
        return tuple(given[name] for name in self.scenario.arguments)


def scenario(
    id: str,
    title: str,
    *,
    fault: str,
    partitions: int = 3,
    min_rounds: int = 1,
    cases: Mapping[str, Mapping[str, object]] | None = None,
    long_only: bool = False,
) -> pytest.MarkDecorator:
    """Declare the decorated test a fault scenario (see :class:`Scenario` for the arguments)."""
    declared = Scenario(id, title, fault, partitions, min_rounds, dict(cases or {}), long_only)
    return pytest.mark.scenario(declared)


def declared(item: pytest.Item) -> Scenario | None:
    """The :class:`Scenario` a test declared, if it did."""
    marker = item.get_closest_marker(MARK)
    if marker is None:
        return None
    found = marker.args[0] if marker.args else None
    if not isinstance(found, Scenario):
        raise TypeError(
            f"@pytest.mark.{MARK} takes a Scenario; use tests.support.scenario.scenario"
        )
    return found


def round_seed(nodeid: str) -> str:
    """The seed of the round that test ``nodeid`` runs: this session's seed and its id."""
    return f"{SEED}:{nodeid}"
