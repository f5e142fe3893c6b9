"""Fault-suite plumbing: seeded runs, quick vs long mode, and the scoreboard.

Seed
    ``KINBOX_FAULT_SEED`` replays a run; otherwise a random seed is drawn. It is
    printed at the start of every run and in the summary. Each run's random
    choices (kill points, batch sizes, delays) come from
    ``random.Random(f"{seed}:{test}:{run}")``, so one scenario replays alone.
Modes
    quick (default, part of the normal test command): one run per scenario.
    long (``KINBOX_FAULTS_LONG=1``): ``KINBOX_FAULTS_RUNS`` runs (default 5),
    each with its own derived seed, and more events per run; ``pytest --long``
    (an option of tests/conftest.py) sets it.
Scoreboard
    every run records what was measured (delivery logs of the worker
    processes, rows counted in the database, offsets read back from the
    broker) and ``pytest_terminal_summary`` prints one row per scenario.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from tests.support.database import prepare_schema
from tests.support.invariants import OffsetSampler, Outcome, assert_invariants, check_invariants
from tests.support.records import Headers, Produced, committed, produce, produce_plan
from tests.support.waiting import wait_for
from tests.support.workers import Worker, WorkerFactory, drain, read_deliveries, workers

SEED_ENV = "KINBOX_FAULT_SEED"
LONG_ENV = "KINBOX_FAULTS_LONG"
RUNS_ENV = "KINBOX_FAULTS_RUNS"

SEED = os.environ.get(SEED_ENV) or str(random.SystemRandom().randrange(10**9))


def long_mode() -> bool:
    """Read when used, not at import: ``pytest --long`` sets the variable after this loads."""
    return os.environ.get(LONG_ENV, "").lower() in {"1", "true", "yes"}


def runs() -> int:
    """Runs per scenario."""
    return int(os.environ.get(RUNS_ENV, "5")) if long_mode() else 1


def events() -> int:
    """Events per run."""
    return 1000 if long_mode() else 300


@dataclass
class Row:
    """One scoreboard line: a scenario summed over its runs."""

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
    seeds: list[str] = field(default_factory=list)

    def add(self, outcome: Outcome | None, seconds: float, seed: str, ok: bool) -> None:
        self.runs += 1
        self.failed += 0 if ok else 1
        self.seconds += seconds
        self.seeds.append(seed)
        if outcome is not None:
            self.produced += outcome.produced
            self.deliveries += outcome.deliveries
            self.applied_once += outcome.applied_once
            self.duplicates_suppressed += outcome.duplicates_suppressed
            self.dead_lettered += outcome.dead_lettered
            self.dead_letters += len(outcome.dead_letters)
            self.lost += len(outcome.lost)
            self.applied_twice += len(outcome.applied_twice)


SCOREBOARD: dict[str, Row] = {}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the fault scoreboard (only when fault scenarios ran)."""
    if not SCOREBOARD:
        return
    tr = terminalreporter
    tr.section(f"kinbox fault scoreboard (seed {SEED}, {'long' if long_mode() else 'quick'} mode)")
    header = (
        f"{'scenario':<34} {'fault':<30} {'runs':>4} {'fail':>4} {'produced':>8} "
        f"{'deliver':>7} {'once':>6} {'dups-supp':>9} {'dlq':>7} {'lost':>4} {'twice':>5} "
        f"{'secs':>6}"
    )
    tr.write_line(header)
    tr.write_line("-" * len(header))
    for row in SCOREBOARD.values():
        tr.write_line(
            f"{row.scenario[:34]:<34} {row.fault[:30]:<30} {row.runs:>4} {row.failed:>4} "
            f"{row.produced:>8} {row.deliveries:>7} {row.applied_once:>6} "
            f"{row.duplicates_suppressed:>9} {f'{row.dead_lettered}/{row.dead_letters}':>7} "
            f"{row.lost:>4} "
            f"{row.applied_twice:>5} {row.seconds:>6.1f}"
        )
    tr.write_line(
        "produced: records written (duplicates included); deliver: records the workers "
        "received (delivery logs); once: events with exactly one effect row; dups-supp: "
        "deliveries the inbox suppressed (kinbox's batch results); dlq: dead_lettered rows in "
        "processed_events / records on the dead-letter topic; lost/twice: events with "
        "0 / >1 effect rows."
    )
    tr.write_line(f"replay: {SEED_ENV}={SEED} pytest tests/faults")


@dataclass
class Run:
    """One run of one scenario: its seed, its own topic/schema/group, and its workers."""

    scenario: str
    index: int
    seed: str
    rng: random.Random
    bootstrap: str
    database_url: str
    topic: str
    partitions: int
    schema: str
    group: str
    log_dir: Path
    factory: WorkerFactory
    produced: Produced | None = None
    outcome: Outcome | None = None
    sampler: OffsetSampler | None = None
    expect_dead: frozenset[str] = frozenset()
    """Event ids this run must end with dead-lettered (invariant 5), and only these."""
    dead_letter_copies: int = 1
    """Most copies of one dead letter the topic may hold (2 where a crash repeats a flush)."""

    def produce(self, count: int | None = None, duplicates: int = 0) -> Produced:
        """Write this run's events (ids ``<run>-<n>``), ``duplicates`` repeats mixed in."""
        self.produced = produce(
            self.bootstrap, self.topic, events() if count is None else count, self.partitions,
            prefix=f"{self.group}-ev", duplicates=duplicates, rng=self.rng,
        )  # fmt: skip
        return self.produced

    def produce_plan(self, items: list[tuple[int, Headers, str | None]]) -> Produced:
        """Write hand-made records (see :func:`~tests.support.records.produce_plan`)."""
        self.produced = produce_plan(self.bootstrap, self.topic, self.partitions, items)
        return self.produced

    @contextmanager
    def sampling(self) -> Iterator[OffsetSampler]:
        """Check invariant 2 in the background while the fault happens."""
        assert self.produced is not None, "produce() first"
        with OffsetSampler(
            self.database_url, self.schema, self.bootstrap, self.group, self.produced
        ) as sampler:
            self.sampler = sampler
            yield sampler

    def wait_caught_up(self, *members: Worker, timeout: float = 90.0) -> None:
        """Wait until the group committed everything; ``members`` must all survive the fault."""
        assert self.produced is not None, "produce() first"
        produced = self.produced
        ends = produced.end_offsets()

        seen: dict[int, int] = {}

        def caught_up() -> bool:
            for worker in members:
                if worker.proc.poll() is not None:
                    raise AssertionError(
                        f"{worker.name} exited ({worker.proc.returncode}) instead of riding out "
                        f"the fault\n{worker.log_tail()}"
                    )
            try:
                got = committed(self.bootstrap, self.group, self.topic, self.partitions)
            except AssertionError:
                return False  # the broker is still coming back
            seen.update(got)
            return all(got.get(p, 0) >= end for p, end in ends.items())

        names = ", ".join(w.name for w in members)
        try:
            wait_for(caught_up, timeout, f"{names} to commit up to {ends}")
        except AssertionError as exc:
            tails = "\n".join(w.log_tail() for w in members)
            raise AssertionError(f"{exc}; last committed {seen}\n{tails}") from None

    def handler_calls(self) -> int:
        """Handler calls so far, over all workers of this run (from their delivery logs)."""
        return read_deliveries(self.log_dir).handler_calls

    def wait_handler_calls(self, count: int, timeout: float = 60.0) -> None:
        """Wait until the handlers ran ``count`` times (the fault should land mid-stream)."""
        wait_for(lambda: self.handler_calls() >= count, timeout, f"{count} handler calls")

    def finish(self, drain_timeout: float = 90.0, drain_args: Sequence[str] = ()) -> Outcome:
        """Final drain with a clean worker, then measure and assert the invariants.

        ``drain_args``: options of the draining ``kinbox worker`` (a run under
        ``--missing-id derive`` drains under it too).
        """
        assert self.produced is not None, "produce() first"
        drain(self.factory, self.produced, timeout=drain_timeout, args=drain_args)
        self.outcome = check_invariants(self.factory, self.produced)
        violations = self.sampler.violations() if self.sampler else []
        if self.sampler is not None:
            assert self.sampler.samples > 0, "the offset sampler never got a reading"
        assert_invariants(
            self.outcome, self.produced, self.factory, violations,
            expect_dead=self.expect_dead, dead_letter_copies=self.dead_letter_copies,
        )  # fmt: skip
        return self.outcome


class Faults:
    """Hands out seeded runs of a scenario and records them on the scoreboard."""

    def __init__(self, nodeid: str, tmp_path: Path) -> None:
        self.nodeid = nodeid
        self.tmp_path = tmp_path
        self.runs = runs()
        self.events = events()

    @contextmanager
    def run(
        self, index: int, fault: str, *, bootstrap: str, database_url: str, partitions: int = 3,
        scenario: str | None = None,
    ) -> Iterator[Run]:  # fmt: skip
        """Set up run ``index`` (topic, schema, group, log dir); score it at the end."""
        name = scenario or self.nodeid.split("::")[-1].removeprefix("test_")
        seed = f"{SEED}:{self.nodeid}:{index}"
        rng = random.Random(seed)
        tag = uuid.UUID(int=rng.getrandbits(128)).hex[:10]
        topic, schema, group = f"fault-{tag}", f"fault_{tag}", f"g-{tag}"
        print(f"[faults] {self.nodeid} run {index}: {SEED_ENV}={SEED} (run seed {seed!r})")
        _create_topic(bootstrap, topic, partitions)
        prepare_schema(database_url, schema)
        started = time.monotonic()
        ok = False
        with workers(
            bootstrap, database_url, group, schema, topic, self.tmp_path / f"run{index}"
        ) as factory:
            run = Run(
                name, index, seed, rng, bootstrap, database_url, topic, partitions, schema,
                group, factory.log_dir, factory,
            )  # fmt: skip
            try:
                yield run
                ok = True
            finally:
                row = SCOREBOARD.setdefault(name, Row(name, fault))
                row.add(run.outcome, time.monotonic() - started, seed, ok)
        _drop_schema(database_url, schema)


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
    )
    futures[topic].result(timeout=30)


def _drop_schema(database_url: str, schema: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def faults(request: pytest.FixtureRequest, tmp_path: Path) -> Faults:
    """Seeded scenario runs for this test (see the module docstring)."""
    return Faults(request.node.nodeid, tmp_path)
