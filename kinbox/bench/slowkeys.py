"""The slow-keys scenario: handlers that wait on the database, one partition, many keys.

What key order is for. ``slow_events`` records (10,000) in one partition over
``slow_keys`` keys (1,000); each record's handler runs ``SELECT
pg_sleep(0.005)`` and writes its effect row in its transaction, as a handler
waiting on a slow query or a lock does. In partition order one partition is
one record at a time; in key order ``key_concurrency`` keys (16) are applied
side by side, each key's records still in offset order. The contenders
(:data:`kinbox.bench.contenders.SLOW`): kinbox in partition order, kinbox in
key order, Confluent's parallel-consumer in KEY order (Java, at-least-once).

**Timed by the effects.** The rate runs from the first effect row's commit
to the last (:func:`kinbox.bench.effects.timed`), not by committed offsets:
parallel-consumer commits offsets on a timer (5 s by default), which would
add up to that much to its run. **CPU** is the contender's process (every
thread, and its children) between the first effect seen and the last:
µs per event and cores. The offsets must still reach the end before the
process is stopped, and the run is checked like every other: each record's
effect exactly once (kinbox), or at least once (parallel-consumer).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from psycopg import sql

from kinbox.bench import effects, workload
from kinbox.bench.context import Context
from kinbox.bench.cpu import cpu_seconds
from kinbox.bench.observe import Progress
from kinbox.bench.process import Child
from kinbox.bench.results import RunResult, Summary, find
from kinbox.bench.runs import Job, Stage, check, prepare, stop, watch
from kinbox.core.errors import KinboxError

SLEEP_S = 0.005
"""What each handler waits on the database (``pg_sleep``), seconds."""
EVERY = 0.05
"""Seconds between looks at the effect table."""
PARTITION, KEY, PC = "kinbox-partition-order", "kinbox-key-order", "parallel-consumer"


def stage(ctx: Context, name: str, seed: int) -> Stage:
    """Produce the scenario's topic: one partition, ``slow_events`` over ``slow_keys`` keys."""
    sizes = ctx.sizes
    work = workload.build(sizes.slow_events, seed=seed, ordered=sizes.ordered_ids)
    topic = ctx.namespace.create_topic(ctx.namespace.topic(name), partitions=1)
    ends = workload.produce(ctx.target, topic, work, keys=sizes.slow_keys)
    return Stage(topic, ends, work.distinct, work.deliveries)


def run(ctx: Context, job: Job) -> RunResult:
    """One contender over the whole topic, timed by its effects; CPU over the same span."""
    prepare(ctx, job)
    result = job.result()
    spec = ctx.spec(job.contender, job.group, job.stage.topic, job.schema, job.table)
    spec = replace(spec, extra={
        "sleep_s": str(SLEEP_S), "concurrency": str(ctx.sizes.key_concurrency),
        "expected": str(job.stage.deliveries),
    })  # fmt: skip
    progress = Progress(ctx.target, job.group, job.stage.topic, job.stage.ends)
    started = time.monotonic()
    try:
        child = ctx.start(spec, job.name)
        span = _effects_span(ctx, job, child)
        watch(ctx, job, child, progress)  # and the offsets to the end
        stop(child)
    finally:
        progress.close()
    result.peak_rss, result.seconds = child.peak_rss, time.monotonic() - started
    check(ctx, job, result, job.stage.deliveries)
    with ctx.connect() as conn:
        rows = effects.timed(conn, job.schema, job.table)
    result.rate = _rate(rows)
    notes = result.notes
    notes.update(
        sleep_ms=SLEEP_S * 1000, keys=ctx.sizes.slow_keys,
        concurrency=1 if job.contender.name == PARTITION else ctx.sizes.key_concurrency,
    )  # fmt: skip
    if span is not None:
        used, seconds, events = span
        notes["cpu_s"] = round(used, 2)
        notes["cpu_us_per_event"] = round(1e6 * used / max(1, events), 1)
        notes["cores"] = round(used / max(1e-9, seconds), 3)
    return result


def _effects_span(ctx: Context, job: Job, child: Child) -> tuple[float, float, int] | None:
    """Watch the effect table from the first row to all of them.

    Returns ``(CPU seconds, wall seconds, events)`` of the contender over
    that span, or ``None`` where its CPU time cannot be read.

    Raises:
        KinboxError: the process exited, or the effects did not all come in time.
    """
    total = job.stage.distinct
    count = sql.SQL("SELECT count(*) FROM {}.{}").format(
        sql.Identifier(job.schema), sql.Identifier(job.table)
    )
    distinct = sql.SQL("SELECT count(DISTINCT event_id) FROM {}.{}").format(
        sql.Identifier(job.schema), sql.Identifier(job.table)
    )
    # Generous: partition order at the handler's wait, twice over, and start-up.
    deadline = time.monotonic() + 120 + 2 * total * SLEEP_S
    first: tuple[float, float | None, int] | None = None
    with ctx.connect() as conn:
        while True:
            child.sample_rss()
            row = conn.execute(count).fetchone()
            rows = int(row[0]) if row else 0
            if rows and first is None:
                first = (time.monotonic(), cpu_seconds(child.pid), rows)
            ctx.tick(min(1.0, rows / max(1, total)))
            if rows >= total:
                seen = conn.execute(distinct).fetchone()
                if seen and int(seen[0]) >= total:
                    break
            if not child.alive():
                raise KinboxError(
                    f"{child.name} exited ({child.returncode}) at {rows}/{total} effects\n"
                    f"{child.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise KinboxError(
                    f"{job.group}: {rows}/{total} effects in time\n{child.log_tail()}"
                )
            time.sleep(EVERY)
    ended, cpu_end = time.monotonic(), cpu_seconds(child.pid)
    assert first is not None
    began, cpu_began, rows_then = first
    if cpu_began is None or cpu_end is None:
        return None
    return cpu_end - cpu_began, ended - began, total - rows_then


def _rate(rows: Sequence[effects.Timed]) -> float | None:
    """Events per second from the first effect's commit to the last (the insert's, if unknown)."""
    exact = all(r.committed is not None for r in rows)
    times = [r.committed if exact and r.committed is not None else r.inserted for r in rows]
    span = max(times) - min(times) if len(times) > 1 else 0.0
    return (len(times) - 1) / span if span > 0 else None


def headline(summaries: Sequence[Summary]) -> dict[str, float | None]:
    """Key order over partition order and over parallel-consumer; each one's CPU per event."""

    def rate(contender: str) -> float | None:
        found = find(summaries, "slow-keys", contender)
        # parallel-consumer is at-least-once: its rate stands only with no duplicate.
        return found.rate if found is not None and found.comparable else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    out: dict[str, float | None] = {
        "slow_keys_key_vs_partition": ratio(rate(KEY), rate(PARTITION)),
        "slow_keys_key_vs_parallel_consumer": ratio(rate(KEY), rate(PC)),
    }
    for contender, short in ((PARTITION, "partition"), (KEY, "key"), (PC, "pc")):
        found = find(summaries, "slow-keys", contender)
        notes = found.notes if found is not None and found.ok else {}
        out[f"slow_keys_{short}_cpu_us_per_event"] = notes.get("cpu_us_per_event")
        out[f"slow_keys_{short}_cores"] = notes.get("cores")
    return out
