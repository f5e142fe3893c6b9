"""The outside scenarios: each contender measured as a team deploys and watches it.

kinbox runs as ``kinbox worker`` started from its command line with its
defaults (:mod:`kinbox.bench.deploy`); the hand-written streaming inbox
(:func:`kinbox.bench.contenders.setbased.run_streaming`) runs beside it, in
its own process, over the same events. Everything is measured from outside
the consumer: its committed offsets, its effect rows, its process's CPU time.

**latency** — an offer (a rate and a producer profile, :func:`offers`), per
contender::

    a fresh topic (3 partitions, LogAppendTime) and effect table
    start the consumer; wait until it holds every partition
    start the feeder (kinbox.bench.feeder: a producer process of its own,
      keys over 50 values, the profile's settings) for the run's seconds,
      and the machine probe over the same window (kinbox.bench.machine)
    wait for the feeder, then for every record's offset to be committed
    the consumer's CPU time from the feeder's start to then: µs per event
    stop it (SIGTERM), check every event applied exactly once
    produce → committed per event: over the run and per window (kinbox.bench.spread);
      produce → the handler's INSERT; the broker's append → committed
    where the time goes, stage by stage (kinbox.bench.stages), from the
      worker's stage stamps of 1 event in ``stage_every`` (kinbox.ops.stamps)

Nothing of the run is left out as warm-up: the first window is a window
like the others, as a deployment's first seconds after a restart are. Only
the producer is ready before its clock starts, as a service's long-lived
producer is (:mod:`kinbox.bench.feeder`).

**drain** — a backlog waiting in the topic (the harness produces it before
the first run); per contender: start the consumer, time it from outside by
its committed offsets until the end. The rate runs from the first commit to
the last (the group join left out, as in every throughput scenario); the
notes add the start-up (process start → first commit), the rate with it,
and the CPU time of the whole process life per event.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kinbox.bench import deploy, effects, machine, stages, workload
from kinbox.bench.context import Context
from kinbox.bench.cpu import cpu_seconds
from kinbox.bench.feeder import FeedSpec
from kinbox.bench.observe import Progress
from kinbox.bench.process import Child
from kinbox.bench.results import RunResult, percentiles
from kinbox.bench.runs import Job, Stage, check, prepare, stop, watch
from kinbox.bench.spec import Sizes
from kinbox.bench.spread import spread
from kinbox.core.errors import KinboxError
from kinbox.ops import stamps

KEYS = 50
"""Distinct record keys the feeder uses."""


@dataclass(frozen=True)
class Offer:
    """One load of the latency scenario: a rate and the feeding producer's profile."""

    rate: int
    producer: str

    @property
    def name(self) -> str:
        """Its results' scenario name: ``latency-<rate>-<producer>``."""
        return f"latency-{self.rate}-{self.producer}"


def offers(sizes: Sizes) -> list[Offer]:
    """Every producer profile at the first rate; the first profile at the other rates."""
    if not sizes.latency_rates or not sizes.latency_producers:
        return []
    first, *others = sizes.latency_rates
    profile = sizes.latency_producers[0]
    return [Offer(first, p) for p in sizes.latency_producers] + [Offer(r, profile) for r in others]


def _feeder(ctx: Context, spec: FeedSpec, name: str) -> Child:
    child = Child(
        name,
        [sys.executable, "-m", "kinbox.bench.feeder"],
        ctx.log_dir / f"{name}.log",
        {FeedSpec.ENV: spec.to_json()},
    )
    ctx.children.append(child)
    return child


def _fed(path: Path) -> dict[str, Any]:
    """The feeder's summary (see :class:`kinbox.bench.feeder.Fed`)."""
    try:
        answer: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise KinboxError(f"the feeder left no summary at {path}: {exc}") from exc
    return answer


def latency(ctx: Context, job: Job, offer: Offer) -> RunResult:
    """One contender under ``offer`` for ``sizes.latency_seconds``, measured from outside."""
    sizes = ctx.sizes
    contender = job.contender
    prepare(ctx, job)
    topic = ctx.namespace.create_topic(
        job.stage.topic, config={"message.timestamp.type": "LogAppendTime"}
    )
    result = job.result()
    spec = ctx.spec(contender, job.group, topic, job.schema, job.table)
    stamped = ctx.log_dir / f"{job.name}.stamps"
    env = {}
    if contender.app is not None and sizes.stage_every:
        env = {stamps.ENV: str(stamped), stamps.EVERY_ENV: str(sizes.stage_every)}
    child = deploy.start(contender, spec, job.name, ctx.log_dir, env)
    ctx.children.append(child)
    ctx.wait_assigned(job.group, child)
    acks = ctx.log_dir / f"{job.name}.acks"
    feed = FeedSpec(
        ctx.target.bootstrap_servers, topic, offer.rate, sizes.latency_seconds, str(acks),
        profile=offer.producer, keys=KEYS, ordered_ids=sizes.ordered_ids,
        kafka=ctx.target.client_config(),
    )  # fmt: skip
    began, cpu_before = time.monotonic(), cpu_seconds(child.pid)
    feeder = _feeder(ctx, feed, f"{job.name}-feeder")
    probe = machine.Probe(time.time(), time.time() + sizes.latency_seconds)
    try:
        status = feeder.wait_exit(sizes.latency_seconds + 120, on_wait=lambda: _alive(child))
        host = probe.result(timeout=30)
    finally:
        probe.close()
    if status != 0:
        raise KinboxError(f"the feeder exited {status}\n{feeder.log_tail()}")
    fed = _fed(Path(f"{acks}.json"))
    ends = workload.end_offsets(ctx.target, topic)
    deliveries = workload.total(ends)
    staged = Job(
        job.scenario, contender, job.rep, Stage(topic, ends, deliveries, deliveries),
        job.schema, job.group,
    )  # fmt: skip
    progress = Progress(ctx.target, job.group, topic, ends)
    try:
        watch(ctx, staged, child, progress)
    finally:
        progress.close()
    cpu_after, ended = cpu_seconds(child.pid), time.monotonic()
    stop(child)
    result.peak_rss = child.peak_rss
    check(ctx, staged, result, deliveries)
    with ctx.connect() as conn:
        rows = effects.timed(conn, job.schema, job.table)
    _latencies(result, rows, acks, stamped, topic, sizes)
    notes = result.notes
    notes.update(
        offered_per_s=offer.rate, producer=offer.producer, seconds=sizes.latency_seconds,
        feeder_behind_max_ms=fed.get("behind_max_ms"), producer_ready_ms=fed.get("ready_ms"),
    )  # fmt: skip
    if cpu_before is not None and cpu_after is not None:
        used = cpu_after - cpu_before
        notes["cpu_s"] = round(used, 2)
        notes["cpu_us_per_event"] = round(1e6 * used / max(1, deliveries), 1)
        notes["cores"] = round(used / max(1e-9, ended - began), 3)
    if host is not None:
        notes.update(
            steal_pct=host.steal_pct, busy_pct=host.busy_pct, load1=host.load1,
            wake_late_p50_ms=host.late_p50_ms, wake_late_p99_ms=host.late_p99_ms,
            wake_late_max_ms=host.late_max_ms,
        )  # fmt: skip
    return result


def _alive(child: Child) -> None:
    if not child.alive():
        raise KinboxError(f"{child.name} exited {child.returncode}\n{child.log_tail()}")


def _latencies(
    result: RunResult,
    rows: list[effects.Timed],
    acks: Path,
    stamped: Path,
    topic: str,
    sizes: Sizes,
) -> None:
    """Fill ``result`` with the run's latencies, its windows and its stages."""
    exact = all(r.committed is not None for r in rows)
    done: dict[stages.Key, float] = {
        (r.partition, r.offset): r.inserted if r.committed is None or not exact else r.committed
        for r in rows
    }
    samples = [(r.sent, 1000 * (done[(r.partition, r.offset)] - r.sent)) for r in rows]
    whole = spread(samples, sizes.latency_window)
    result.p50_ms, result.p99_ms = whole.p50_ms, whole.p99_ms
    result.latency_method = "commit timestamp" if exact else "insert time (lower bound)"
    result.notes["samples"] = whole.samples
    result.notes.update(whole.as_notes())
    i50, i99 = percentiles([1000 * (r.inserted - r.sent) for r in rows])
    result.notes["insert_p50_ms"], result.notes["insert_p99_ms"] = round(i50, 2), round(i99, 2)
    appended = stages.read_appended(acks)
    produced = {(r.partition, r.offset): r.sent for r in rows}
    # The consumer's part alone: what the broker's append waited for (a
    # producer's retry, the broker's own first seconds on a new topic) is
    # left out, so a window that is bad before any consumer could see its
    # records shows as such, for every contender alike.
    legs = [
        (produced[key], 1000 * (at - appended[key])) for key, at in done.items() if key in appended
    ]
    if len(legs) >= 2:
        consumer = spread(legs, sizes.latency_window)
        result.notes["from_append_p50_ms"] = round(consumer.p50_ms, 2)
        result.notes["from_append_p99_ms"] = round(consumer.p99_ms, 2)
        result.notes["worst_window_from_append_p99_ms"] = round(consumer.worst_p99_ms, 2)
    times: dict[str, dict[stages.Key, float]] = {
        "produced": produced,
        "appended": appended,
        "inserted": {(r.partition, r.offset): r.inserted for r in rows},
    }
    if exact:
        times["committed"] = done
    times.update(stages.read_stamps(stamped, topic))
    every = max(1, sizes.stage_every)
    sample = times.get("fetched") or [k for k in done if k[1] % every == 0]
    result.notes["stages"] = [
        {k: round(v, 2) if isinstance(v, float) else v for k, v in leg.__dict__.items()}
        for leg in stages.split(times, sample)
    ]


def drain(ctx: Context, job: Job) -> RunResult:
    """One contender drains the backlog in ``job``'s topic, timed from outside."""
    prepare(ctx, job)
    result = job.result()
    spec = ctx.spec(job.contender, job.group, job.stage.topic, job.schema, job.table)
    progress = Progress(ctx.target, job.group, job.stage.topic, job.stage.ends)
    started = time.monotonic()
    try:
        child = deploy.start(job.contender, spec, job.name, ctx.log_dir)
        ctx.children.append(child)
        watch(ctx, job, child, progress)
        used = cpu_seconds(child.pid)
        stop(child)
    finally:
        progress.close()
    result.rate, result.peak_rss = progress.rate(), child.peak_rss
    result.seconds = time.monotonic() - started
    if progress.first is not None and progress.last is not None:
        result.notes["startup_s"] = round(progress.first[0] - started, 2)
        result.notes["rate_with_startup"] = round(progress.total / (progress.last[0] - started), 1)
    if used is not None:
        result.notes["cpu_s"] = round(used, 2)
        result.notes["cpu_us_per_event"] = round(1e6 * used / max(1, progress.total), 1)
    return check(ctx, job, result, job.stage.deliveries)
