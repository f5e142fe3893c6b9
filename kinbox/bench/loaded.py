"""Runs against a big ``processed_events``: preloading it, and a clean run on it."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql

from kinbox.bench import workload
from kinbox.bench.context import Context
from kinbox.bench.results import RunResult
from kinbox.bench.runs import Job, Stage, steady


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
