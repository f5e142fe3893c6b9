"""One round of a fault scenario: its seed, its own topic, schema and group, its workers.

A scenario's story gets a :class:`Run` (the ``run`` fixture of
tests/faults/conftest.py) and tells it what to do: produce the round's
events, start workers with failpoints, inject the fault while
:meth:`Run.sampling` checks invariant 2 in the background, wait for the
group to catch up, and :meth:`Run.finish`: a clean drain, then every
invariant asserted on what the database and the broker hold.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.database import drop_schema, prepare_schema
from tests.support.invariants import OffsetSampler, Outcome, assert_invariants, check_invariants
from tests.support.records import Headers, Produced, committed, produce, produce_plan
from tests.support.topics import create_topic
from tests.support.waiting import wait_for
from tests.support.workers import Worker, WorkerFactory, drain, read_deliveries, workers


@dataclass
class Run:
    """One round of one scenario, and what it produced and measured."""

    rng: random.Random
    """The round's random choices (kill points, batch sizes, delays): seeded, so it replays."""
    events: int
    """Events to produce when the story does not say how many (300 quick, 1000 long)."""
    rounds: int
    """Rounds this scenario runs this session (a story may vary more over many)."""
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
    """Event ids this round must end with dead-lettered (invariant 5), and only these."""
    dead_letter_copies: int = 1
    """Most copies of one dead letter the topic may hold (2 where a crash repeats a flush)."""
    replayed: frozenset[str] = frozenset()
    """Event ids whose dead letters this round replayed (applied since; letters kept)."""

    def produce(self, count: int | None = None, duplicates: int = 0, keys: int = 0) -> Produced:
        """Write this round's events (ids ``<group>-ev-<n>``), ``duplicates`` repeats mixed in.

        ``keys``: above 0, the records are keyed over that many keys (``k<n % keys>``).
        """
        self.produced = produce(
            self.bootstrap, self.topic, self.events if count is None else count, self.partitions,
            prefix=f"{self.group}-ev", duplicates=duplicates, rng=self.rng, keys=keys,
        )  # fmt: skip
        return self.produced

    def produce_plan(self, items: list[tuple[int, Headers, str | None]]) -> Produced:
        """Write hand-made records (see :func:`~tests.support.records.produce_plan`)."""
        self.produced = produce_plan(self.bootstrap, self.topic, self.partitions, items)
        return self.produced

    @contextmanager
    def sampling(self, *, monotonic: bool = False) -> Iterator[OffsetSampler]:
        """Check invariant 2 in the background while the fault happens.

        Before :meth:`produce`, the records are taken to be known only at
        the end (a relay publishes them): the samples are judged then.
        ``monotonic``: a committed offset must never move back either.
        """
        with OffsetSampler(
            self.database_url, self.schema, self.bootstrap, self.group, self.produced,
            topic=self.topic, partitions=self.partitions, monotonic=monotonic,
        ) as sampler:  # fmt: skip
            self.sampler = sampler
            yield sampler

    def wait_caught_up(self, *members: Worker, timeout: float = 90.0) -> None:
        """Wait until the group committed everything; ``members`` must all survive the fault."""
        assert self.produced is not None, "produce() first"
        ends = self.produced.end_offsets()
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
            tails = "\n".join(w.stuck_report() for w in members)
            raise AssertionError(f"{exc}; last committed {seen}\n{tails}") from None

    def handler_calls(self) -> int:
        """Handler calls so far, over all workers of this round (from their delivery logs)."""
        return read_deliveries(self.log_dir).handler_calls

    def wait_handler_calls(self, count: int, timeout: float = 60.0) -> None:
        """Wait until the handlers ran ``count`` times (the fault should land mid-stream).

        Fails at once if every worker of the round has exited, and with the
        workers' log tails either way: a wait that times out must say whether
        the worker was stuck (and where) or merely slow.
        """
        running = [w for w in self.factory.started if w.proc.poll() is None]

        def reached() -> bool:
            if running and all(w.proc.poll() is not None for w in running):
                raise AssertionError(f"every worker exited before {count} handler calls")
            return self.handler_calls() >= count

        try:
            wait_for(reached, timeout, f"{count} handler calls")
        except AssertionError as exc:
            tails = "\n".join(w.log_tail() for w in running)
            raise AssertionError(f"{exc} (made {self.handler_calls()})\n{tails}") from None

    def finish(
        self, drain_timeout: float = 90.0, drain_args: Sequence[str] = (),
        drain_kafka: Mapping[str, str | None] | None = None,
    ) -> Outcome:  # fmt: skip
        """Final drain with a clean worker, then measure and assert the invariants.

        ``drain_args``: options of the draining ``kinbox worker`` (a round under
        ``--missing-id derive`` drains under it too); ``drain_kafka``: its
        ``-X`` properties (the assignment strategy of the members before it).
        """
        assert self.produced is not None, "produce() first"
        drain(
            self.factory, self.produced, timeout=drain_timeout, args=drain_args, kafka=drain_kafka
        )
        self.outcome = check_invariants(self.factory, self.produced)
        violations = self.sampler.violations(self.produced) if self.sampler else []
        if self.sampler is not None:
            assert self.sampler.samples > 0, "the offset sampler never got a reading"
        assert_invariants(
            self.outcome, self.produced, self.factory, violations,
            expect_dead=self.expect_dead, dead_letter_copies=self.dead_letter_copies,
            replayed=self.replayed,
        )  # fmt: skip
        return self.outcome


@contextmanager
def open_run(
    seed: str, *, bootstrap: str, database_url: str, partitions: int, events: int, rounds: int,
    log_dir: Path,
) -> Iterator[Run]:  # fmt: skip
    """Set up a round seeded by ``seed``: a topic, a schema, a group of its own, a log dir.

    Every worker the round started is SIGKILLed when the block ends, then its
    schema is dropped; the topic stays (the broker is per session).
    """
    rng = random.Random(seed)
    tag = uuid.UUID(int=rng.getrandbits(128)).hex[:10]
    topic, schema, group = f"fault-{tag}", f"fault_{tag}", f"g-{tag}"
    # The broker's replication factor: the fault suite also runs on three brokers.
    create_topic(bootstrap, topic, partitions, replication_factor=-1)
    prepare_schema(database_url, schema)
    with workers(bootstrap, database_url, group, schema, topic, log_dir) as factory:
        yield Run(
            rng, events, rounds, bootstrap, database_url, topic, partitions, schema, group,
            factory.log_dir, factory,
        )  # fmt: skip
    drop_schema(database_url, schema)
