"""The outbox relay, measured from outside: a backlog, commit → consumer latency, the trigger.

The relay runs as ``kinbox outbox relay`` with its default settings, in its
own process (so its peak RSS is its own).

- **trigger**: what the outbox's NOTIFY trigger costs a writer's INSERT, in
  an outbox of its own that nobody publishes (:func:`kinbox.bench.outbox_sql.trigger_cost`).
- **backlog**: N rows written by SQL in one transaction (200 keys), then
  the relay is started; rows/s between the first and the last row marked
  sent (``sent_at``, the relay's own clock_timestamp() after Kafka
  acknowledged the row), and from the relay's process start to the last
  row sent (start-up included: what a team sees after a restart). Beside
  them, the relay process's CPU time per row (start-up included), and how
  busy the machine was while rows were still pending: the relay, the
  database and the broker share it.
- **latency**: rows committed while the relay runs, each timed from the
  writer's COMMIT returning to a consumer holding the record: by
  ``enqueue``, one at a time (``relay-notify``); by plain SQL at a steady
  rate (``relay-sql``); and by plain SQL with the table's trigger disabled,
  so only the relay's poll interval finds them (``relay-polling``) — the
  fallback's cost.
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

from kinbox.bench import effects, machine, outbox_sql
from kinbox.bench.context import Context
from kinbox.bench.cpu import cpu_seconds
from kinbox.bench.process import Child
from kinbox.bench.results import RunResult, percentiles
from kinbox.core.errors import KinboxError


def _relay(ctx: Context, schema: str, name: str) -> Child:
    argv = [
        sys.executable, "-m", "kinbox", "outbox", "relay",
        "--database-url", ctx.target.database_url, "--schema", schema,
        "--bootstrap-servers", ctx.target.bootstrap_servers, "--log-level", "WARNING",
    ]  # fmt: skip
    for key, value in ctx.target.client_config().items():
        if key != "bootstrap.servers":
            argv += ["-X", f"{key}={value}"]
    child = Child(name, argv, ctx.log_dir / f"{name}.log")
    ctx.children.append(child)
    return child


def run(ctx: Context, schema: str, rep: int) -> list[RunResult]:
    """The trigger's cost, the backlog, then latency: enqueue, SQL at a steady rate, polling."""
    topic = ctx.namespace.create_topic(ctx.namespace.topic("outbox", str(rep)))
    rows = ctx.sizes.outbox_rows
    results = [_trigger(ctx, rep)]
    began = time.monotonic()
    with ctx.connect() as conn:
        commit_backlog(conn, schema, topic, rows)
        table = sql.Identifier(schema, "outbox")
        idle_before = machine.idle_times()
        relay = _relay(ctx, schema, f"outbox-relay-{rep}")
        backlog = RunResult("outbox", "relay-backlog", rep)
        backlog.notes["write_s"] = round(time.monotonic() - began, 1)
        started = time.monotonic()
        pending = sql.SQL("SELECT count(*) FROM {} WHERE status = 'pending'").format(table)
        idle_pending = idle_before  # the last look that still saw rows pending
        while True:
            relay.sample_rss()
            looked = machine.idle_times()
            row = conn.execute(pending).fetchone()
            left = int(row[0]) if row else -1
            ctx.tick(1 - left / max(1, rows) if left >= 0 else 0.0)
            if left == 0:
                used = cpu_seconds(relay.pid)
                break
            idle_pending = looked
            if not relay.alive() or time.monotonic() - started > 120 + rows / 100:
                raise KinboxError(f"relay: {left} rows still pending\n{relay.log_tail()}")
            # Not faster: the count reads every pending row's index entry, and
            # at 20 a second it took a quarter of PostgreSQL's CPU time during
            # a 100,000-row drain (9 of 35 µs a row), slowing what it measures.
            # The rate comes from sent_at, so how often this looks changes nothing.
            time.sleep(0.5)
        span = conn.execute(
            sql.SQL(
                "SELECT count(*), extract(epoch FROM max(sent_at) - min(sent_at))::float8,"
                " extract(epoch FROM max(sent_at))::float8 FROM {}"
            ).format(table)
        ).fetchone()
        assert span is not None
        backlog.records = backlog.effects = backlog.distinct = int(span[0])
        if int(span[0]) != rows:
            raise KinboxError(f"relay: {span[0]} rows sent, {rows} written")
        backlog.rate = (rows - 1) / span[1] if span[1] else None
        last = float(span[2]) - effects.clock_offset(conn)
        backlog.notes["rate_with_startup"] = round(rows / max(1e-9, last - relay.started), 1)
        backlog.notes["startup_s"] = round(last - relay.started - (span[1] or 0.0), 2)
        if used is not None:
            backlog.notes["cpu_us_per_row"] = round(1e6 * used / rows, 1)
        busy = machine.busy_share(idle_before, idle_pending)
        if busy is not None:
            backlog.notes["busy_pct"] = round(busy, 1)
        backlog.seconds = time.monotonic() - started
        results.append(backlog)
        results.append(timed_latency(ctx, conn, schema, topic, "relay-notify", rep))
        results.append(_steady(ctx, schema, topic, rep))
        outbox_sql.set_trigger(conn, schema, enabled=False)
        try:
            results.append(
                timed_latency(ctx, conn, schema, topic, "relay-polling", rep, notify=False)
            )
        finally:
            outbox_sql.set_trigger(conn, schema, enabled=True)
        relay.stop()
    for result in results:
        result.peak_rss = relay.peak_rss
    return results


def commit_backlog(conn: psycopg.Connection[Any], schema: str, topic: str, rows: int) -> None:
    """Write ``rows`` events for ``topic`` by SQL (200 keys, ``{"n": n, ...}``), one transaction."""
    outbox_sql.backlog(conn, schema, topic, rows)


def _trigger(ctx: Context, rep: int) -> RunResult:
    """The NOTIFY trigger's cost per INSERT, in an outbox of its own."""
    from kinbox.store.postgres import apply_migrations
    from producer_outbox.schema import OUTBOX

    schema = ctx.namespace.schema(f"trigger{rep}")
    apply_migrations(ctx.target.database_url, schema, [OUTBOX])
    result = RunResult("outbox", "trigger", rep)
    result.notes.update(outbox_sql.trigger_cost(ctx, schema, ctx.sizes.outbox_trigger_statements))
    return result


def _steady(ctx: Context, schema: str, topic: str, rep: int) -> RunResult:
    """Plain SQL rows at a steady rate, each timed from its COMMIT to the consumer."""
    sizes = ctx.sizes
    values = outbox_sql.steady(ctx, schema, topic, sizes.outbox_sql_rate, sizes.outbox_sql_seconds)
    result = RunResult("outbox", "relay-sql", rep, records=len(values))
    p50, p99 = percentiles(values) if len(values) >= 2 else (values[0], values[0])
    result.p50_ms, result.p99_ms = 1000 * p50, 1000 * p99
    result.latency_method = "COMMIT returned → record polled by a consumer"
    result.notes["rows_per_s"] = sizes.outbox_sql_rate
    return result


def timed_latency(
    ctx: Context,
    conn: psycopg.Connection[Any],
    schema: str,
    topic: str,
    name: str,
    rep: int,
    *,
    notify: bool = True,
) -> RunResult:
    """The outbox scenario's latency run ``name``: :func:`latency`'s samples, p50 and p99."""
    samples = ctx.sizes.outbox_samples if notify else ctx.sizes.outbox_polling_samples
    began = time.monotonic()
    values = latency(ctx, conn, schema, topic, samples, notify=notify)
    result = RunResult("outbox", name, rep, records=samples)
    result.notes["latency_s"] = round(time.monotonic() - began, 1)
    p50, p99 = percentiles(values)
    result.p50_ms, result.p99_ms = 1000 * p50, 1000 * p99
    result.latency_method = "COMMIT returned → record polled by a consumer"
    return result


def latency(
    ctx: Context,
    conn: psycopg.Connection[Any],
    schema: str,
    topic: str,
    samples: int,
    *,
    notify: bool,
) -> list[float]:
    """Commit ``samples`` rows one at a time; return each COMMIT → record-polled time, seconds.

    Whatever publishes ``topic`` (the relay, Debezium) must be running.
    ``notify``: by ``enqueue``, or the same row inserted by plain SQL (the
    caller disables the table's trigger to time the poll alone).
    """
    from producer_outbox import enqueue
    from producer_outbox.ids import new_event_id

    consumer = outbox_sql.tail(ctx, topic, "latency")
    plain = sql.SQL(
        "INSERT INTO {} (id, topic, aggregatetype, aggregateid, payload)"
        " VALUES (%s, %s, %s, 'lat', jsonb_build_object('marker', %s::text))"
    ).format(sql.Identifier(schema, "outbox"))
    values: list[float] = []
    try:
        for n in range(samples):
            marker = uuid.uuid4().hex
            with conn.transaction():
                if notify:
                    enqueue(conn, topic, {"marker": marker}, key="lat", schema=schema)
                else:
                    conn.execute(plain, (new_event_id(), topic, topic, marker))
            committed = time.perf_counter()
            deadline = committed + 30
            while True:
                message = consumer.poll(0.01)
                if (
                    message is not None
                    and not message.error()
                    and marker.encode() in (message.value() or b"")
                ):
                    values.append(time.perf_counter() - committed)
                    break
                if time.perf_counter() > deadline:
                    raise KinboxError(f"outbox latency: record {marker} not seen in 30s")
            ctx.tick((n + 1) / samples)
            time.sleep(0.05 + (n % 7) * 0.03)  # spread commits over the relay's poll cycle
    finally:
        consumer.close()
    return values
