"""The fault suite: scenarios declared once, each run in seeded rounds, scored at the end.

Adding a scenario
    Declare it and write its story; nothing else::

        from tests.support.fault_run import Run
        from tests.support.scenario import scenario

        @scenario("18", "zombie member", fault="member SIGSTOPped past session")
        def test_zombie_member(run: Run) -> None:
            run.produce(duplicates=run.rng.randint(0, 10))
            with run.sampling():
                # Given ... When ... Then ...
                worker = run.factory.start("victim", failpoints="...")
                ...
            run.finish()  # final drain, then every invariant, on the scoreboard

    * ``run`` (:class:`tests.support.fault_run.Run`) is one round: its own
      topic, schema and group, a seeded ``run.rng`` for every random choice,
      ``run.factory`` for real ``kinbox worker`` processes (killed at the end).
    * Variants of one story are ``cases`` of the declaration (see
      :mod:`tests.support.scenario`), never ``pytest.mark.parametrize``.
    * A scenario that needs its own broker or database server (to kill it)
      overrides the fixture ``fault_bootstrap`` or ``fault_database_url`` in
      its module; the round's topic and schema are then created there.
    * Shared helpers live in tests/support: ``waiting.wait_for``,
      ``database`` (schema, effect table), ``topics.create_topic``,
      ``records`` (produce, read back, committed offsets), ``workers`` and
      ``launch`` (worker processes and their ``KINBOX_*`` timings),
      ``outbox`` (relay processes, reading a topic), ``faultproxy``.

Rounds and seeds
    :mod:`tests.support.scenario`: quick mode runs one round of each scenario,
    ``--long`` / ``KINBOX_FAULTS_LONG=1`` runs ``KINBOX_FAULTS_RUNS`` (default
    5), each round its own test (``test_x[7-eager-round3]``) seeded from
    ``KINBOX_FAULT_SEED`` and its test id, so a failing round replays alone.
Scoreboard
    :mod:`tests.support.scoreboard`, printed after the session: one row per
    scenario (per case), summed over its rounds.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from kinbox.devstack.stack import Stack
from tests.support import scoreboard
from tests.support.fault_run import Run, open_run
from tests.support.scenario import (
    LONG_ENV,
    MARK,
    SEED,
    SEED_ENV,
    Round,
    declared,
    events_per_round,
    long_mode,
    round_seed,
)

_CALL_PASSED = pytest.StashKey[bool]()
_DECLARED: dict[str, str] = {}
"""Scenario id -> the test declaring it: one id, one story, one set of scoreboard rows."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARK}(declaration): a fault scenario (tests.support.scenario.scenario)"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Expand a declared scenario into its rounds: ``fault_round`` and the case's arguments."""
    declaration = declared(metafunc.definition)
    where = metafunc.definition.nodeid
    if declaration is None:
        if "run" in metafunc.fixturenames:
            raise pytest.UsageError(f"{where} uses `run` but declares no @scenario")
        return
    if "run" not in metafunc.fixturenames:
        raise pytest.UsageError(f"{where} declares a scenario but takes no `run`")
    if metafunc.definition.get_closest_marker("parametrize"):
        raise pytest.UsageError(f"{where}: declare a scenario's variants as its cases")
    if _DECLARED.setdefault(declaration.id, where) != where:
        raise pytest.UsageError(
            f"scenario {declaration.id} declared twice: {_DECLARED[declaration.id]} and {where}"
        )
    rounds = declaration.expand()
    skip = (
        [pytest.mark.skip(reason=f"long mode only: --long or {LONG_ENV}=1")]
        if declaration.long_only and not long_mode()
        else []
    )
    metafunc.parametrize(
        ["fault_round", *declaration.arguments],
        [pytest.param(r, *r.arguments, marks=skip) for r in rounds],
        ids=[r.id for r in rounds],
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Remember whether the test body passed, for the round's line on the scoreboard."""
    report = yield
    if report.when == "call":
        item.stash[_CALL_PASSED] = report.passed
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the fault scoreboard (only when fault scenarios ran)."""
    scoreboard.write(terminalreporter)


@pytest.fixture
def fault_round() -> Round:
    """Filled in per test by :func:`pytest_generate_tests`; only scenarios have it."""
    raise pytest.UsageError("fault_round comes from a @scenario declaration")


@pytest.fixture
def fault_bootstrap(stack: Stack) -> str:
    """The broker a round runs against: the session's (a module may give its own)."""
    return stack.bootstrap_servers


@pytest.fixture
def fault_database_url(stack: Stack) -> str:
    """The database a round runs against: the session's (a module may give its own)."""
    return stack.database_url


@pytest.fixture
def run(
    request: pytest.FixtureRequest, fault_round: Round, fault_bootstrap: str,
    fault_database_url: str, tmp_path: Path,
) -> Iterator[Run]:  # fmt: skip
    """This test's round of its scenario: set up, handed to the story, scored, cleaned up."""
    nodeid = request.node.nodeid
    seed = round_seed(nodeid)
    print(f"[faults] {nodeid}: {SEED_ENV}={SEED} (round seed {seed!r})")
    declaration = fault_round.scenario
    started = time.monotonic()
    outcome = None
    try:
        with open_run(
            seed, bootstrap=fault_bootstrap, database_url=fault_database_url,
            partitions=declaration.partitions, events=events_per_round(),
            rounds=declaration.rounds(), log_dir=tmp_path / "run",
        ) as opened:  # fmt: skip
            yield opened
            outcome = opened.outcome
    finally:
        passed = request.node.stash.get(_CALL_PASSED, False)
        scoreboard.score(fault_round.name, fault_round.fault, outcome,
                         time.monotonic() - started, nodeid, passed)  # fmt: skip
