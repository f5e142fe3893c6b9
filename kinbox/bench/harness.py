"""The plan of runs and its execution: scenarios in order, contenders interleaved and repeated.

Within a scenario every repetition runs every contender once, in an order
rotated by one each time, so no contender always runs first (on a fresh
page cache) or last (after the others have warmed, or tired, the machine).
Each run is checked as soon as it ends; a failed one is announced at once
and kept only as a failure.
"""

from __future__ import annotations

import logging
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from confluent_kafka import KafkaException

from kinbox.bench import cdc, loaded, outbox, outside, runs, slowkeys, workload
from kinbox.bench.contenders import Contender
from kinbox.bench.context import Context
from kinbox.bench.progress import Bar
from kinbox.bench.resources import Interrupted, Namespace
from kinbox.bench.results import UNTIMED, RunResult
from kinbox.bench.scenarios import EMPTY, Scenario
from kinbox.bench.spec import Sizes, Target
from kinbox.core.errors import KinboxError

log = logging.getLogger(__name__)


@dataclass
class BenchResult:
    """Everything a benchmark invocation produced."""

    results: list[RunResult] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def failures(self) -> list[RunResult]:
        """The runs that failed their check or did not finish."""
        return [r for r in self.results if not r.ok]


def chosen(scenario: Scenario, contenders: Sequence[Contender]) -> list[Contender]:
    """The contenders among ``contenders`` that ``scenario`` applies to, in their order."""
    return [c for c in contenders if c.name in scenario.contenders]


NO_CONNECT = (
    "outbox · debezium: no Kafka Connect URL (kinbox bench --connect-url URL, or "
    "KINBOX_CONNECT_URL), so the relay ran alone"
)
"""The report's line when the CDC contender cannot run."""


def rotated(runners: Sequence[Contender], rep: int) -> list[Contender]:
    """The order of repetition ``rep``: shifted by one each time, so none always runs first."""
    shift = rep % len(runners) if runners else 0
    return [*runners[shift:], *runners[:shift]]


def plan_size(
    scenarios: Sequence[Scenario],
    contenders: Sequence[Contender],
    sizes: Sizes,
    *,
    with_cdc: bool,
) -> int:
    """How many runs the plan holds (for the progress bar); ``with_cdc``: Debezium runs too."""
    publishers = 2 if with_cdc else 1
    count = 0
    for scenario in scenarios:
        runners = publishers if scenario.kind == "outbox" else len(chosen(scenario, contenders))
        variants = {"large": 2, "latency": len(outside.offers(sizes))}.get(scenario.kind, 1)
        count += scenario.repeats(sizes.repeat) * runners * variants
    return count


class Harness:
    """Runs ``scenarios`` x ``contenders`` on ``target``.

    Args:
        target: the cluster and database, and the namespace prefix.
        sizes: how much work each scenario does.
        scenarios: from :data:`~kinbox.bench.scenarios.SCENARIOS` (or a test's own).
        contenders: from :data:`~kinbox.bench.contenders.CONTENDERS` (or a test's own);
            one whose optional package is missing is skipped and said so.
        log_dir: where the processes' logs go (a temporary directory by default).
    """

    def __init__(
        self,
        target: Target,
        sizes: Sizes,
        scenarios: Sequence[Scenario],
        contenders: Sequence[Contender],
        log_dir: Path | None = None,
        stream_bar: bool = True,
    ) -> None:
        self.target = target
        self.sizes = sizes
        self.scenarios = list(scenarios)
        self.outcome = BenchResult()
        self.contenders: list[Contender] = []
        for contender in contenders:
            missing = contender.missing()
            if missing is None:
                self.contenders.append(contender)
            else:
                self.outcome.skipped.append(f"{contender.name}: {missing}")
        self.namespace = Namespace(target)
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="kinbox-bench-"))
        planned = plan_size(
            self.scenarios, self.contenders, sizes, with_cdc=bool(target.connect_url)
        )
        self.bar = Bar(planned) if stream_bar else None
        self.ctx = Context(target, self.namespace, sizes, self.log_dir, tick=self._tick)

    def _tick(self, fraction: float) -> None:
        if self.bar is not None:
            self.bar.update(fraction)

    def _say(self, line: str) -> None:
        if self.bar is not None:
            self.bar.say(line)
        else:
            log.warning("%s", line)

    def run(self) -> BenchResult:
        """Run the plan; the caller removes the namespace afterwards (see :meth:`cleanup`)."""
        from kinbox.store.postgres import apply_migrations
        from kinbox.store.schema import INBOX
        from producer_outbox.schema import OUTBOX

        apply_migrations(self.target.database_url, self.namespace.schema(), [INBOX, OUTBOX])
        for note in self.outcome.skipped:
            self._say(f"skipped: {note}")
        try:
            for index, scenario in enumerate(self.scenarios):
                self._scenario(index, scenario)
        finally:
            if self.bar is not None:
                self.bar.close()
        return self.outcome

    def cleanup(self) -> list[str]:
        """Kill the processes still running and remove every topic, group and schema."""
        self.ctx.stop_all()
        return self.namespace.remove()

    def _scenario(self, index: int, scenario: Scenario) -> None:
        runners = chosen(scenario, self.contenders)
        repeat = scenario.repeats(self.sizes.repeat)
        self._checkpoint()
        if scenario.kind == "outbox":
            # The relay first, then Debezium on the same table: each alone on
            # the database while it is timed (no slot decodes the relay's run).
            with_cdc = bool(self.target.connect_url)
            for rep in range(repeat):
                self._execute(
                    f"outbox · relay · rep {rep + 1}", "outbox", "relay", rep, self._outbox(rep)
                )
                if with_cdc:
                    self._execute(
                        f"outbox · debezium · rep {rep + 1}", "outbox", "debezium", rep,
                        self._cdc(rep),
                    )  # fmt: skip
            if not with_cdc:
                self.outcome.skipped.append(NO_CONNECT)
                self._say(NO_CONNECT)
            return
        if not runners:
            return
        if scenario.kind == "latency":
            self._latency(runners, repeat)
            return
        stages = self._stages(index, scenario, runners)
        if scenario.kind == "large":
            self._preload()
        # The large table's control: the same run on an empty table, right
        # before it, so the two differ in the table and in nothing else.
        variants = (EMPTY, scenario.name) if scenario.kind == "large" else (scenario.name,)
        for rep in range(repeat):
            for contender in rotated(runners, rep):
                for variant in variants:
                    job = self._job(scenario, contender, rep, stages, variant)
                    label = f"{variant} · {contender.name} · rep {rep + 1}"
                    self._execute(
                        label, variant, contender.name, rep, self._run(scenario, job, index)
                    )

    def _latency(self, runners: list[Contender], repeat: int) -> None:
        """Every offer, every contender (rotated), from outside: a topic per run."""
        for rep in range(repeat):
            for offer in outside.offers(self.sizes):
                for contender in rotated(runners, rep):
                    topic = self.namespace.topic(offer.name, contender.name, str(rep))
                    job = runs.Job(
                        offer.name, contender, rep, runs.Stage(topic, {}, 0, 0),
                        self.namespace.schema(),
                        self.namespace.group(offer.name, contender.name, str(rep)),
                    )  # fmt: skip
                    self._execute(
                        f"{offer.name} · {contender.name} · rep {rep + 1}", offer.name,
                        contender.name, rep, self._outside(job, offer),
                    )  # fmt: skip

    def _outside(self, job: runs.Job, offer: outside.Offer) -> Callable[[], list[RunResult]]:
        return lambda: [outside.latency(self.ctx, job, offer)]

    def _execute(
        self, label: str, scenario: str, contender: str, rep: int,
        action: Callable[[], list[RunResult]],
    ) -> None:  # fmt: skip
        if self.bar is not None:
            self.bar.begin(label)
        started = time.monotonic()
        try:
            done = action()
            for result in done:
                result.notes["wall_s"] = round(time.monotonic() - started, 1)
                if UNTIMED in result.notes:
                    self.outcome.skipped.append(f"{label}: no figure: {result.notes[UNTIMED]}")
            self.outcome.results += done
        except Interrupted:
            raise
        except (KinboxError, psycopg.Error, KafkaException) as exc:
            self.ctx.stop_all()
            failed = RunResult(scenario, contender, rep, ok=False, error=str(exc))
            self.outcome.results.append(failed)
            self._say(f"*** FAILED: {label}: {exc}")
        finally:
            if self.bar is not None:
                self.bar.end()
        self.ctx.children.clear()

    def _outbox(self, rep: int) -> Callable[[], list[RunResult]]:
        return lambda: outbox.run(self.ctx, self.namespace.schema(), rep)

    def _cdc(self, rep: int) -> Callable[[], list[RunResult]]:
        return lambda: cdc.run(self.ctx, self.namespace.schema(), rep)

    def _run(self, scenario: Scenario, job: runs.Job, index: int) -> Callable[[], list[RunResult]]:
        return lambda: [self._dispatch(scenario, job, index)]

    def _dispatch(self, scenario: Scenario, job: runs.Job, index: int) -> RunResult:
        if scenario.kind == "redelivery":
            return runs.redelivery(self.ctx, job)
        if scenario.kind == "replay":
            return runs.replay(self.ctx, job)
        if scenario.kind == "storm":
            return runs.storm(self.ctx, job)
        if scenario.kind == "large":
            events = self.sizes.scaled(job.contender.scale)
            # Fresh ids for every run: the runs share one group, hence one dedup scope.
            seed = zlib.crc32(f"{index}/{job.scenario}/{job.contender.name}/{job.rep}".encode())
            return loaded.large(self.ctx, job, events, seed=seed)
        if scenario.kind == "drain":
            return outside.drain(self.ctx, job)
        if scenario.kind == "slowkeys":
            return slowkeys.run(self.ctx, job)
        return runs.steady(self.ctx, job)

    def _stages(
        self, index: int, scenario: Scenario, runners: list[Contender]
    ) -> dict[str, runs.Stage]:
        """Produce the scenario's topics (one per contender scale); map contender → stage."""
        if scenario.kind == "large":
            return {}  # a topic per run, made by the run
        if scenario.kind == "slowkeys":
            shared = slowkeys.stage(self.ctx, scenario.name, seed=index)
            return {c.name: shared for c in runners}
        sizes = {
            c.name: self.sizes.backlog_events
            if scenario.pad
            else self.sizes.scaled(c.scale * scenario.events)
            for c in runners
        }
        full = workload.build(
            max(sizes.values()), scenario.duplicates, seed=index, pad=scenario.pad,
            ordered=self.sizes.ordered_ids,
        )  # fmt: skip
        made: dict[int, runs.Stage] = {}
        for events in sorted(set(sizes.values()), reverse=True):
            work = full.head(events)
            topic = self.namespace.create_topic(self.namespace.topic(scenario.name, f"n{events}"))
            ends = workload.produce(self.target, topic, work)
            made[events] = runs.Stage(topic, ends, work.distinct, work.deliveries)
        return {name: made[events] for name, events in sizes.items()}

    def _job(
        self, scenario: Scenario, contender: Contender, rep: int,
        stages: dict[str, runs.Stage], variant: str,
    ) -> runs.Job:  # fmt: skip
        name = contender.name
        if scenario.kind == "large":
            # One group (one dedup scope) per table, whose rows the preload made.
            topic = self.namespace.topic(variant, name, str(rep))
            schema, group = self.namespace.schema(variant), self.namespace.group(variant)
            return runs.Job(variant, contender, rep, runs.Stage(topic, {}, 0, 0), schema, group)
        stage = stages[name]
        return runs.Job(scenario.name, contender, rep, stage, self.namespace.schema(),
                        self.namespace.group(scenario.name, name, str(rep)))  # fmt: skip

    def _preload(self) -> None:
        from kinbox.store.postgres import apply_migrations
        from kinbox.store.schema import INBOX

        schema = self.namespace.schema("large")
        apply_migrations(self.target.database_url, self.namespace.schema(EMPTY), [INBOX])
        apply_migrations(self.target.database_url, schema, [INBOX])
        self._say(f"loading {self.sizes.large_rows:,} rows into {schema}.processed_events ...")
        seconds = loaded.preload(
            self.ctx, schema, self.namespace.group("large"), self.sizes.large_rows
        )
        self.outcome.notes["large_rows"] = self.sizes.large_rows
        self.outcome.notes["large_load_seconds"] = round(seconds, 1)
        self._say(f"loaded in {seconds:.0f}s")
        self._checkpoint()

    def _checkpoint(self) -> None:
        """Have the database write out what came before, so the next runs do not pay for it.

        A ``CHECKPOINT`` before each scenario (and after the preload) flushes
        what earlier ones left dirty and finishes a checkpoint under way: the
        10M-row preload alone leaves about 2 GB to write, and a checkpoint
        spread over the next minutes competed with the next scenario's
        commits for the disk (the latency scenario, right after the large
        one, measured p99s of 56-61 ms on an idle machine, 15-24 ms when it
        ran on a quiet disk). It needs a superuser or the ``pg_checkpoint``
        role: without one the runs start as they are, and the notes say so.
        """
        try:
            with self.ctx.connect() as conn:
                conn.execute("CHECKPOINT")
        except psycopg.Error as exc:
            if "checkpoint" not in self.outcome.notes:
                self.outcome.notes["checkpoint"] = f"not run: {exc}".strip()
                self._say(f"no CHECKPOINT between scenarios: {exc}")
            return
        self.outcome.notes.setdefault("checkpoint", "before each scenario, after the preload")
