"""Runs under another load than a backlog: a big ``processed_events``, or an offered rate."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql

from kinbox.bench import effects, machine, workload
from kinbox.bench.context import Context
from kinbox.bench.observe import Progress
from kinbox.bench.results import RunResult
from kinbox.bench.runs import Job, Stage, check, prepare, steady, stop, watch


def preload(ctx: Context, schema: str, consumer: str, rows: int) -> float:
    """Fill ``schema.processed_events`` with ``rows`` rows of ``consumer``; return seconds taken.

    The fast way: drop the table's indexes, ``INSERT … SELECT`` from
    ``generate_series`` (ids are md5-based UUIDs, spread over the key space
    like real ones), rebuild the indexes from their own definitions (a sorted
    build, not row-by-row inserts), then ``VACUUM ANALYZE`` so the runs start
    with set hint bits, a visibility map and statistics — a table that has
    grown over months, not one loaded a second ago.
    """
    started = time.monotonic()
    table = sql.Identifier(schema, "processed_events")
    with ctx.connect() as conn:
        conn.execute("SET maintenance_work_mem = '512MB'")
        with conn.transaction():
            definitions = _index_definitions(conn, schema)
            for name, constraint, _ in definitions:
                if constraint:
                    conn.execute(
                        sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(
                            table, sql.Identifier(name)
                        )
                    )
                else:
                    conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(schema, name)))
            conn.execute(
                sql.SQL(
                    'INSERT INTO {} (consumer, event_id, status, topic, partition, "offset")'
                    " SELECT %s, md5(g::text)::uuid::text, 'applied', 'preloaded', 0, g"
                    " FROM generate_series(1, %s) AS g"
                ).format(table),
                (consumer, rows),
            )
            for name, constraint, definition in definitions:
                if constraint:
                    conn.execute(
                        sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} ").format(
                            table, sql.Identifier(name)
                        )
                        + sql.SQL(definition)  # from pg_get_constraintdef: the server's own text
                    )
                else:
                    conn.execute(sql.SQL(definition))  # from pg_get_indexdef
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
    return time.monotonic() - started


def _index_definitions(conn: psycopg.Connection[Any], schema: str) -> list[tuple[str, bool, str]]:
    """``(name, is a constraint, definition)`` of every index on ``processed_events``."""
    rows = conn.execute(
        "SELECT i.relname, c.conname IS NOT NULL,"
        " coalesce(pg_get_constraintdef(c.oid), pg_get_indexdef(i.oid))"
        " FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid"
        " LEFT JOIN pg_constraint c ON c.conindid = x.indexrelid"
        " WHERE x.indrelid = to_regclass(%s)",
        (f'"{schema}".processed_events',),
    ).fetchall()
    return [(str(n), bool(k), str(d)) for n, k, d in rows]


def large(ctx: Context, job: Job, events: int, seed: int) -> RunResult:
    """A clean run on a topic of fresh events, by a group whose inbox is already big."""
    work = workload.build(events, seed=seed, ordered=ctx.sizes.ordered_ids)
    topic = ctx.namespace.create_topic(job.stage.topic)
    ends = workload.produce(ctx.target, topic, work)
    staged = Job(
        job.scenario, job.contender, job.rep,
        Stage(topic, ends, work.distinct, work.deliveries), job.schema, job.group,
    )  # fmt: skip
    return steady(ctx, staged)


def latency(ctx: Context, job: Job) -> RunResult:
    """Offer ``latency_rate`` events/s to a running member; produce → effect committed."""
    sizes = ctx.sizes
    prepare(ctx, job)
    # The broker stamps each record with its append time, which the producer's
    # acknowledgements return: the latency splits at the broker into the
    # producer's leg and the consumer's (the contender's own).
    topic = ctx.namespace.create_topic(
        job.stage.topic, config={"message.timestamp.type": "LogAppendTime"}
    )
    result = job.result()
    spec = ctx.spec(job.contender, job.group, topic, job.schema, job.table)
    child = ctx.start(spec, job.name)
    ctx.wait_assigned(job.group, child)
    offered = sizes.latency_warmup + sizes.latency_seconds
    work = workload.build(round(sizes.latency_rate * offered), seed=7, ordered=sizes.ordered_ids)
    # The warm-up (a freshly started stack's cold broker and caches, the
    # member's first fetches and connections) gets the same load, unmeasured.
    warm_until = time.time() + sizes.latency_warmup
    # What the machine itself did in the measured window: a tail is partly its own.
    probe = machine.Probe(warm_until, warm_until + sizes.latency_seconds)
    appended: dict[tuple[int, int], float] = {}
    try:
        ends = workload.produce(
            ctx.target, topic, work, rate=sizes.latency_rate, linger_ms=0, appended=appended
        )
        host = probe.result()
    finally:
        probe.close()
    staged = Job(
        job.scenario, job.contender, job.rep,
        Stage(topic, ends, work.distinct, work.deliveries), job.schema, job.group,
    )  # fmt: skip
    progress = Progress(ctx.target, job.group, topic, ends)
    try:
        watch(ctx, staged, child, progress)
        stop(child)
    finally:
        progress.close()
    result.peak_rss = child.peak_rss
    with ctx.connect() as conn:
        measured = effects.latency(
            conn, job.schema, job.table, skip_before=warm_until, appended=appended
        )
    result.p50_ms, result.p99_ms = measured.p50, measured.p99
    if measured.append_samples:
        result.notes["from_append_p50_ms"] = measured.append_p50
        result.notes["from_append_p99_ms"] = measured.append_p99
    if host is not None:
        result.notes["steal_pct"] = host.steal_pct
        result.notes["wake_late_p50_ms"] = host.late_p50_ms
        result.notes["wake_late_p99_ms"] = host.late_p99_ms
        result.notes["wake_late_max_ms"] = host.late_max_ms
    result.latency_method = measured.method
    result.notes["offered_per_s"] = sizes.latency_rate
    result.notes["warmup_s"] = sizes.latency_warmup
    result.notes["samples"] = measured.samples
    return check(ctx, staged, result, work.deliveries)
