"""How each kind of scenario runs one contender once, and checks it.

Every procedure ends in :func:`check`: the effects are counted while the
run's processes are stopped, and a mismatch raises
:class:`~kinbox.bench.effects.CheckFailed` before any figure is kept.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass

from confluent_kafka import (
    ConsumerGroupState,
    ConsumerGroupTopicPartitions,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from kinbox.bench import effects
from kinbox.bench.contenders import Contender
from kinbox.bench.context import Context
from kinbox.bench.observe import INTERVAL, Progress, Stuck
from kinbox.bench.process import Child
from kinbox.bench.results import UNTIMED, RunResult
from kinbox.core.errors import KinboxError


@dataclass(frozen=True)
class Stage:
    """A produced topic, as one contender sees it."""

    topic: str
    ends: dict[int, int]
    distinct: int
    deliveries: int


@dataclass(frozen=True)
class Job:
    """One run: which contender, in which scenario, on what, under which names."""

    scenario: str
    contender: Contender
    rep: int
    stage: Stage
    schema: str
    group: str

    @property
    def table(self) -> str:
        """The run's own effect table."""
        return f"e_{self.scenario}_{self.contender.name.replace('-', '_')}_{self.rep}"

    @property
    def name(self) -> str:
        """For logs and process names."""
        return f"{self.scenario}-{self.contender.name}-{self.rep}"

    def result(self) -> RunResult:
        """An empty result for this run."""
        return RunResult(self.scenario, self.contender.name, self.rep)


def _timeout(records: int) -> float:
    # Generous: a run that is merely slow must not be failed as stuck.
    return 120.0 + records / 20


def prepare(ctx: Context, job: Job) -> None:
    """Create the run's empty effect table."""
    with ctx.connect() as conn:
        effects.create_table(conn, job.schema, job.table)


def stop(child: Child, *, young: bool = False) -> None:
    """Stop ``child`` cleanly (SIGTERM); anything but exit 0 is a failure of the run.

    Raises:
        KinboxError: the process did not exit cleanly (its log tail attached).
    """
    status = child.stop()
    # A member told to leave while still starting (the storm's quick mode) dies
    # of the SIGTERM's default action: it had not subscribed yet, so nothing
    # of it is lost and its partitions never moved.
    if status != 0 and not (young and status == -signal.SIGTERM):
        raise KinboxError(f"{child.name} exited {status} on SIGTERM\n{child.log_tail()}")


def check(ctx: Context, job: Job, result: RunResult, deliveries: int) -> RunResult:
    """Count the effects; raise CheckFailed unless the contender kept its promise."""
    with ctx.connect() as conn:
        found = effects.tally(conn, job.schema, job.table)
    result.duplicates_applied = found.check(
        job.stage.distinct, exactly_once=job.contender.exactly_once
    )
    result.records = job.stage.deliveries
    result.distinct = job.stage.distinct
    result.effects = found.rows
    result.duplicates_suppressed = max(0, deliveries - found.rows)
    return result


def watch(ctx: Context, job: Job, child: Child, progress: Progress) -> None:
    """Sample ``progress`` (and the child's RSS) until the topic is done.

    Raises:
        KinboxError: the child exited or the run got stuck (its log tail attached).
    """

    def sampled(fraction: float) -> None:
        child.sample_rss()
        ctx.tick(fraction)

    try:
        progress.wait(_timeout(progress.total), sampled, child.alive)
    except Stuck as exc:
        raise KinboxError(f"{exc}\n{child.log_tail()}") from None


def steady(ctx: Context, job: Job) -> RunResult:
    """One member consumes the whole topic."""
    prepare(ctx, job)
    result = job.result()
    progress = Progress(ctx.target, job.group, job.stage.topic, job.stage.ends)
    started = time.monotonic()
    try:
        child = ctx.start(ctx.spec(job.contender, job.group, job.stage.topic, job.schema,
                                   job.table), job.name)  # fmt: skip
        watch(ctx, job, child, progress)
        stop(child)
    finally:
        progress.close()
    result.rate, result.peak_rss = progress.rate(), child.peak_rss
    result.seconds = time.monotonic() - started
    return check(ctx, job, result, job.stage.deliveries)


def kill_spacing(deliveries: int, kills: int, commit_size: int) -> int:
    """After how many database commits each (re)started member is killed.

    A commit covers at most ``commit_size`` events, so ``kills`` kills this
    far apart all fall before the end of ``deliveries``. (Spaced by the mean
    commit instead, the later kills missed the end whenever a poll's worth
    came from one partition.)
    """
    return max(1, deliveries // ((kills + 1) * commit_size))


def redelivery(ctx: Context, job: Job) -> RunResult:
    """Kill the member between DB commit and offset commit, restart it; repeat ``kills`` times.

    ``notes["redelivered"]`` counts, per kill, the records the killed member
    applied past the committed offsets (:func:`kinbox.bench.effects.redelivered`):
    a batch of an earlier member that it was killed before reaching is still
    past them, but is delivered again once, not once per kill.
    """
    prepare(ctx, job)
    result = job.result()
    kills = ctx.sizes.kills
    every = kill_spacing(job.stage.deliveries, kills, job.contender.commit_size)
    armed = f"after_db_commit=kill@{every}"
    # Static membership: the restarted process takes its partitions back at
    # once; a short session ends the group after the last (graceful) stop.
    spec = ctx.spec(
        job.contender,
        job.group,
        job.stage.topic,
        job.schema,
        job.table,
        {"group.instance.id": f"{job.group}.member", "session.timeout.ms": "10000"},
    )
    progress = Progress(ctx.target, job.group, job.stage.topic, job.stage.ends)
    started = time.monotonic()
    redelivered, peak = 0, 0
    try:
        # The server's clock when each member starts: its own effects are those
        # written since, and only they count as its redelivered batch.
        with ctx.connect() as conn:
            born = effects.server_time(conn)
        child = ctx.start(spec, f"{job.name}-0", armed if kills else "")
        deadline = time.monotonic() + _timeout(progress.total) * 2
        while True:
            peak = max(peak, child.sample_rss())
            ctx.tick(progress.sample() / max(1, progress.total))
            if progress.finished:
                break
            if not child.alive():
                if child.returncode != -signal.SIGKILL or result.kills >= kills:
                    raise KinboxError(f"{child.name} exited {child.returncode}\n{child.log_tail()}")
                result.kills += 1
                with ctx.connect() as conn:
                    reached = effects.frontier(conn, job.schema, job.table)
                    own = effects.frontier(conn, job.schema, job.table, since=born)
                    born = effects.server_time(conn)
                redelivered += effects.redelivered(
                    reached, own, progress.committed(), exactly_once=job.contender.exactly_once
                )
                child = ctx.start(
                    spec, f"{job.name}-{result.kills}", armed if result.kills < kills else ""
                )
            if time.monotonic() > deadline:
                raise KinboxError(f"{job.group}: not done in time\n{child.log_tail()}")
            time.sleep(INTERVAL)
        stop(child)
    finally:
        progress.close()
    result.rate, result.peak_rss = progress.rate(), max(peak, child.peak_rss)
    result.seconds = time.monotonic() - started
    result.notes["redelivered"] = redelivered
    check(ctx, job, result, job.stage.deliveries + redelivered)
    if result.kills < kills:
        # The topic was done first: the figure would be a clean stream's.
        raise KinboxError(
            f"{job.group}: the topic was done after {result.kills} of {kills} kills "
            "between the database commit and the offset commit"
        )
    return result


def replay(ctx: Context, job: Job) -> RunResult:
    """Consume everything, reset the group's offsets to the start, consume everything again."""
    first = steady(ctx, job)
    _reset_offsets(ctx, job)
    result = job.result()
    progress = Progress(ctx.target, job.group, job.stage.topic, job.stage.ends)
    started = time.monotonic()
    try:
        child = ctx.start(ctx.spec(job.contender, job.group, job.stage.topic, job.schema,
                                   job.table), f"{job.name}-replay")  # fmt: skip
        watch(ctx, job, child, progress)
        stop(child)
    finally:
        progress.close()
    result.rate, result.peak_rss = progress.rate(), max(first.peak_rss, child.peak_rss)
    result.seconds = time.monotonic() - started
    result.notes["first_pass_rate"] = first.rate
    return check(ctx, job, result, 2 * job.stage.deliveries)


def _reset_offsets(ctx: Context, job: Job, timeout: float = 60.0) -> None:
    """Set the group's offsets to 0, and read them back to be sure.

    The broker takes new offsets only from an empty group, and may say no per
    partition rather than for the request; a reset that silently did not
    happen would make the replay's figure a measurement of nothing.

    Raises:
        KinboxError: the offsets are not 0 after ``timeout`` seconds.
    """
    admin = AdminClient(ctx.target.client_config())
    parts = [TopicPartition(job.stage.topic, p, 0) for p in sorted(job.stage.ends)]
    probe = Progress(ctx.target, job.group, job.stage.topic, job.stage.ends)
    deadline = time.monotonic() + timeout
    problem = ""
    try:
        while time.monotonic() < deadline:
            try:
                group = admin.describe_consumer_groups([job.group])[job.group].result(10)
                if group.state == ConsumerGroupState.EMPTY:
                    request = [ConsumerGroupTopicPartitions(job.group, parts)]
                    done = admin.alter_consumer_group_offsets(request)[job.group].result(10)
                    errors = [tp.error for tp in done.topic_partitions or [] if tp.error]
                    problem = str(errors[0]) if errors else ""
                    if not errors and not any(probe.committed().values()):
                        return
                else:
                    problem = f"group is {group.state}, not empty"
            except KafkaException as exc:
                problem = str(exc)
            time.sleep(0.5)
    finally:
        probe.close()
    raise KinboxError(f"resetting {job.group}'s offsets to 0 failed: {problem}")


STORM = ((0.2, "join"), (0.2, "join"), (0.2, "leave"), (0.2, "leave"))
"""Members join and leave from this share of records committed on, each change as soon as
the one before has taken effect: back to back, so the storm needs as short a run as it can."""
SETTLED_EVERY = 0.1
"""Seconds between asks whether the group has settled after a change."""


def storm(ctx: Context, job: Job) -> RunResult:
    """Members join and leave while the topic is consumed (1 → 2 → 3 → 2 → 1).

    A change waits for the one before it to take effect (the group stable,
    with as many members holding partitions as are running), so a member
    never leaves before it has joined; ``notes["changes"]`` counts the changes
    that took effect before the topic was done. A run done before all of
    them is checked but has no rate: it would be mostly a clean stream's.
    """
    prepare(ctx, job)
    result = job.result()
    spec = ctx.spec(job.contender, job.group, job.stage.topic, job.schema, job.table)
    members = [ctx.start(spec, f"{job.name}-m0")]
    leaving: list[Child] = []
    plan = list(STORM)
    changes, pending, asked = 0, False, 0.0

    def sampled(fraction: float) -> None:
        nonlocal changes, pending, asked
        for member in members + leaving:
            member.sample_rss()
        ctx.tick(fraction)
        if pending:
            if time.monotonic() - asked < SETTLED_EVERY:
                return
            asked = time.monotonic()
            if ctx.holders(job.group) != len(members):
                return
            changes, pending = changes + 1, False
        if plan and fraction >= plan[0][0]:
            _, action = plan.pop(0)
            if action == "join":
                members.append(ctx.start(spec, f"{job.name}-m{len(members) + len(leaving)}"))
            else:
                member = members.pop(0)
                member.terminate()
                leaving.append(member)
            pending, asked = True, time.monotonic()

    progress = Progress(ctx.target, job.group, job.stage.topic, job.stage.ends)
    started = time.monotonic()
    try:
        try:
            progress.wait(
                _timeout(progress.total), sampled, lambda: any(m.alive() for m in members)
            )
        except Stuck as exc:
            raise KinboxError(f"{exc}\n{members[0].log_tail() if members else ''}") from None
        for member in members + leaving:
            stop(member, young=True)
    finally:
        progress.close()
    result.rate = progress.rate()
    result.peak_rss = max(m.peak_rss for m in members + leaving)
    result.seconds = time.monotonic() - started
    result.notes["members"] = len(members) + len(leaving)
    result.notes["changes"] = changes
    if changes < len(STORM):
        # Checked all the same, but its rate would be mostly a clean stream's.
        result.rate = None
        result.notes[UNTIMED] = (
            f"the topic was done after {changes} of {len(STORM)} membership changes "
            "took effect (more events make the run outlast them)"
        )
    return check(ctx, job, result, job.stage.deliveries)
