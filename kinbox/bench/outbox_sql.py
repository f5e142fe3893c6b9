"""The outbox written by SQL, as any writer does: a backlog, a steady writer, the trigger's cost.

Rows here come from plain ``INSERT`` statements, never :func:`~producer_outbox.enqueue`:
what an ORM, a migration script or a service in another language sends. The
table's ``outbox_notify`` trigger is what wakes the relay for them.

- :func:`backlog`: N rows (200 keys, time-ordered ids as ``enqueue`` makes
  them) in one statement and one transaction.
- :func:`steady`: a writer committing one row at a time at a fixed rate,
  each timed from its COMMIT returning to a consumer holding the record.
- :func:`trigger_cost`: what the trigger adds to a writer's INSERT,
  single-row and 100-row statements each in its own transaction (durable
  COMMITs), in alternating rounds with the trigger enabled and disabled,
  while a connection LISTENs on the channel as a relay does.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql

from kinbox.bench.context import Context
from kinbox.bench.resources import PARTITIONS
from kinbox.core.errors import KinboxError
from producer_outbox.ids import new_event_id
from producer_outbox.schema import notify_channel

_ROWS = (
    "INSERT INTO {} (id, topic, aggregatetype, aggregateid, payload)"
    " SELECT i, %s, %s, 'k' || (n %% 200), jsonb_build_object('n', n, 'pad', repeat('x', 64))"
    " FROM unnest(%s::uuid[]) WITH ORDINALITY AS t(i, n) ORDER BY n"
)


def backlog(conn: psycopg.Connection[Any], schema: str, topic: str, rows: int) -> None:
    """Write ``rows`` outbox rows for ``topic`` by SQL in one transaction (200 keys, ``n`` 1..N)."""
    ids = [new_event_id() for _ in range(rows)]
    with conn.transaction():
        conn.execute(sql.SQL(_ROWS).format(sql.Identifier(schema, "outbox")), (topic, topic, ids))


def _one_row(schema: str) -> sql.Composed:
    return sql.SQL(
        "INSERT INTO {} (id, topic, aggregatetype, aggregateid, payload)"
        " VALUES (%s, %s, %s, 'steady', jsonb_build_object('marker', %s::text))"
    ).format(sql.Identifier(schema, "outbox"))


def tail(ctx: Context, topic: str, name: str) -> Consumer:
    """A consumer of ``topic`` from its current end, quick to hand over what arrives."""
    consumer = Consumer(
        {**ctx.target.client_config(consumer=True), "group.id": ctx.namespace.group(name),
         "fetch.wait.max.ms": 5, "enable.auto.commit": False}
    )  # fmt: skip
    # Exactly at the current end; "latest" is resolved lazily and could miss
    # the first record produced right after subscribing.
    parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(
        [TopicPartition(topic, tp.partition, consumer.get_watermark_offsets(tp, 10)[1])
         for tp in parts]
    )  # fmt: skip
    return consumer


def steady(ctx: Context, schema: str, topic: str, rate: float, seconds: float) -> list[float]:
    """Commit one row every ``1/rate`` s for ``seconds``; return each COMMIT → record, seconds.

    The writer keeps its schedule whatever the relay does (a thread of its
    own); whatever publishes ``topic`` must be running.

    Raises:
        KinboxError: a committed row did not reach the topic within 30 s.
    """
    consumer = tail(ctx, topic, "steady")
    # Marker → when its COMMIT returned, and when the consumer held it: a
    # record may arrive before the writer's thread has noted its COMMIT.
    committed: dict[str, float] = {}
    arrived: dict[str, float] = {}
    total = max(1, round(rate * seconds))
    failure: list[BaseException] = []

    def write() -> None:
        try:
            with psycopg.connect(ctx.target.database_url, autocommit=True) as conn:
                start = time.perf_counter()
                for n in range(total):
                    delay = start + n / rate - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                    marker = uuid.uuid4().hex
                    conn.execute(_one_row(schema), (new_event_id(), topic, topic, marker))
                    committed[marker] = time.perf_counter()
        except BaseException as exc:  # surfaced below
            failure.append(exc)

    writer = threading.Thread(target=write, name="outbox-steady-writer", daemon=True)
    writer.start()
    try:
        deadline = time.monotonic() + seconds + 30
        while len(arrived) < total and not failure:
            message = consumer.poll(0.01)
            if message is not None and not message.error():
                marker = json.loads(message.value() or b"{}").get("marker")
                if isinstance(marker, str):
                    arrived.setdefault(marker, time.perf_counter())
            if time.monotonic() > deadline:
                raise KinboxError(f"outbox steady writer: {total - len(arrived)} rows not seen")
    finally:
        writer.join(seconds + 30)
        consumer.close()
    if failure:
        raise KinboxError(f"outbox steady writer failed: {failure[0]}") from failure[0]
    return [arrived[m] - at for m, at in committed.items() if m in arrived]


def set_trigger(conn: psycopg.Connection[Any], schema: str, *, enabled: bool) -> None:
    """Enable or disable the outbox's NOTIFY trigger (the table's owner may)."""
    verb = sql.SQL("ENABLE" if enabled else "DISABLE")
    conn.execute(
        sql.SQL("ALTER TABLE {} {} TRIGGER outbox_notify").format(
            sql.Identifier(schema, "outbox"), verb
        )
    )


def trigger_cost(ctx: Context, schema: str, statements: int) -> dict[str, float]:
    """Microseconds per INSERT statement with and without the trigger, each its own transaction.

    ``schema`` is an outbox nobody publishes (its rows are removed after
    each round); a connection LISTENs on its channel meanwhile, as a relay's
    does. Eight rounds alternate enabled / disabled, so a drift of the
    machine falls on both; each figure is the fastest of its rounds (what
    the statements cost when nothing else took the cores from them).
    """
    table = sql.Identifier(schema, "outbox")
    multi = sql.SQL(
        "INSERT INTO {} (id, topic, aggregatetype, payload)"
        " SELECT i, 't', 't', '{{}}'::jsonb FROM unnest(%s::uuid[]) AS i"
    ).format(table)
    single = sql.SQL(
        "INSERT INTO {} (id, topic, aggregatetype, payload) VALUES (%s, 't', 't', '{{}}'::jsonb)"
    ).format(table)
    rounds: dict[str, list[float]] = {}
    with (
        ctx.connect() as conn,
        ctx.connect() as listener,
    ):
        listener.execute(sql.SQL("LISTEN {}").format(sql.Identifier(notify_channel(schema))))
        for enabled in (True, False) * 4:
            set_trigger(conn, schema, enabled=enabled)
            kind = "on" if enabled else "off"
            began = time.perf_counter()
            for _ in range(statements):
                conn.execute(single, (new_event_id(),))
            rounds.setdefault(f"single_{kind}", []).append(time.perf_counter() - began)
            many = max(1, statements // 10)
            began = time.perf_counter()
            for _ in range(many):
                conn.execute(multi, ([new_event_id() for _ in range(100)],))
            rounds.setdefault(f"multi100_{kind}", []).append(time.perf_counter() - began)
            conn.execute(sql.SQL("TRUNCATE {}").format(table))
            for _ in listener.notifies(timeout=0.01):
                pass  # drain what the round sent
        set_trigger(conn, schema, enabled=True)
    per = {"single": statements, "multi100": max(1, statements // 10)}
    out: dict[str, float] = {}
    for key, times in rounds.items():
        out[f"{key}_us"] = round(1e6 * min(times) / per[key.split("_")[0]], 1)
    for kind in per:
        out[f"{kind}_added_us"] = round(out[f"{kind}_on_us"] - out[f"{kind}_off_us"], 1)
    return out
