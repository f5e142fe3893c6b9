"""The outbox through Debezium (CDC): a backlog's throughput, and COMMIT → consumer latency.

The outbox scenario's second contender, beside the relay
(:mod:`kinbox.bench.outbox`): the same rows in the same table, published by
Debezium's PostgreSQL connector with its Outbox Event Router on the Kafka
Connect cluster at ``Target.connect_url`` (``python -m benchmarks`` starts one
with :mod:`kinbox.devstack`, as ``kinbox dev --cdc`` does). The connector is
registered as a user registers it: by running ``kinbox outbox debezium-config
--register`` with its defaults.

- **backlog**: the connector is registered (its slot exists from then on, and
  ``snapshot.mode=no_data`` streams what is committed after it) and stopped
  (its task gone, the slot inactive, nothing decoded); N rows are committed
  exactly as for the relay (:func:`~kinbox.bench.outbox.commit_backlog`);
  then the connector is resumed. rows/s between the first and the last
  record appended to the topic, which keeps ``LogAppendTime`` (the broker's
  clock when each record reached Kafka): the task's start-up is left out, as
  the relay's is. The time from the resume to the first and to the last record
  is kept in the run's notes.
- **latency**: the relay's procedure (:func:`~kinbox.bench.outbox.latency`)
  with the connector running: COMMIT returned → the record polled by a consumer.

Checked like every run, before a figure is kept: every committed row's id
arrives, no other id does, and each key's events arrive in commit order. A
repeat (Debezium is at-least-once) is counted in the notes, not hidden.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, Message, TopicPartition
from psycopg import sql

from kinbox.bench.contenders.common import event_id
from kinbox.bench.context import Context
from kinbox.bench.effects import CheckFailed
from kinbox.bench.outbox import commit_backlog, timed_latency
from kinbox.bench.resources import PARTITIONS
from kinbox.bench.results import RunResult
from kinbox.core.errors import KinboxError
from producer_outbox.connect_api import ConnectClient
from producer_outbox.slots import drop_slot


@dataclass(frozen=True)
class Arrival:
    """One backlog record as it came out of Kafka."""

    event_id: str
    key: str | None
    n: int
    """The row's place in the backlog (its ``{"n": ...}``): commit order within a key."""
    partition: int
    offset: int
    appended_ms: int


def check_backlog(committed: set[str], arrivals: Sequence[Arrival]) -> int:
    """Check what Debezium published against the committed rows; return the repeats.

    Raises:
        CheckFailed: a committed row never arrived, a record no row accounts
            for did, or a key's events came out of commit order.
    """
    seen = {a.event_id for a in arrivals}
    if seen != committed:
        missing, foreign = committed - seen, seen - committed
        raise CheckFailed(
            f"Debezium: {len(missing)} of {len(committed)} committed rows never arrived, "
            f"{len(foreign)} records of no committed row did"
        )
    last: dict[str | None, int] = {}
    first_time: set[str] = set()
    for a in sorted(arrivals, key=lambda a: (a.partition, a.offset)):
        if a.event_id in first_time:
            continue  # a repeat re-sends what came before; order is about first arrivals
        first_time.add(a.event_id)
        if a.n < last.get(a.key, -1):
            raise CheckFailed(
                f"Debezium: key {a.key!r} out of commit order: row {a.n} after row {last[a.key]}"
            )
        last[a.key] = a.n
    return len(arrivals) - len(seen)


def run(ctx: Context, schema: str, rep: int) -> list[RunResult]:
    """Register the connector, time a backlog, then latency; remove connector and slot."""
    url = ctx.target.connect_url
    if not url:
        raise KinboxError("the CDC contender needs a Kafka Connect URL (--connect-url)")
    client = ConnectClient(url)
    name = ctx.namespace.connector("outbox", str(rep))
    slot = ctx.namespace.slot("outbox", str(rep))
    topic = ctx.namespace.create_topic(
        ctx.namespace.topic("cdc", str(rep)), config={"message.timestamp.type": "LogAppendTime"}
    )
    rows = ctx.sizes.outbox_rows
    with ctx.connect() as conn:
        _require_logical(conn)
        try:
            _register(ctx, schema, name, slot)
            client.stop(name)
            client.wait_stopped(name, timeout=120)
            _wait_slot(conn, slot, active=False)
            began = time.monotonic()
            commit_backlog(conn, schema, topic, rows)
            backlog = RunResult("outbox", "debezium-backlog", rep)
            backlog.notes["enqueue_s"] = round(time.monotonic() - began, 1)
            arrivals = _resume_and_read(ctx, client, name, topic, rows, backlog)
            committed = {
                str(row[0])
                for row in conn.execute(
                    sql.SQL("SELECT id FROM {} WHERE topic = %s").format(
                        sql.Identifier(schema, "outbox")
                    ),
                    (topic,),
                )
            }
            repeats = check_backlog(committed, arrivals)
            backlog.records, backlog.effects = len(arrivals), len(committed)
            backlog.distinct = len(committed)
            backlog.notes["repeats"] = repeats
            span = max(a.appended_ms for a in arrivals) - min(a.appended_ms for a in arrivals)
            backlog.rate = (rows - 1) / (span / 1000) if span else None
            client.wait_running(name, timeout=60)
            latency = timed_latency(ctx, conn, schema, topic, "debezium-latency", rep)
        finally:
            _remove(client, conn, name, slot)
    return [backlog, latency]


def _require_logical(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SHOW wal_level").fetchone()
    if not row or row[0] != "logical":
        raise KinboxError(
            f"the CDC contender needs wal_level=logical on the database (it is {row and row[0]!r})"
        )


def _register(ctx: Context, schema: str, name: str, slot: str) -> None:
    """``kinbox outbox debezium-config --register``, as a user runs it (its defaults)."""
    assert ctx.target.connect_url is not None
    argv = [
        sys.executable, "-m", "kinbox", "outbox", "debezium-config",
        "--register", ctx.target.connect_url, "--name", name, "--topic-prefix", name,
        "--slot-name", slot, "--timeout", "120",
    ]  # fmt: skip
    if ctx.target.connect_database_address:
        argv += ["--database-address", ctx.target.connect_database_address]
    # The URL goes through the environment: a password in it stays out of `ps`.
    env = {**os.environ, "KINBOX_DATABASE_URL": ctx.target.database_url, "KINBOX_SCHEMA": schema}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=240, check=False)
    if done.returncode != 0:
        raise KinboxError(
            f"kinbox outbox debezium-config --register exited {done.returncode}:\n"
            f"{done.stdout}{done.stderr}"
        )


def _wait_slot(conn: psycopg.Connection[Any], slot: str, *, active: bool) -> None:
    deadline = time.monotonic() + 60
    while True:
        row = conn.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
        if row is None:
            raise KinboxError(f"replication slot {slot!r} is missing")
        if bool(row[0]) == active:
            return
        if time.monotonic() > deadline:
            raise KinboxError(f"replication slot {slot!r} still active={row[0]} after 60s")
        time.sleep(0.05)


def _resume_and_read(
    ctx: Context, client: ConnectClient, name: str, topic: str, rows: int, result: RunResult
) -> list[Arrival]:
    """Resume the connector and read the topic until every one of ``rows`` ids came."""
    consumer = Consumer(
        {**ctx.target.client_config(consumer=True), "group.id": ctx.namespace.group("cdc"),
         "enable.auto.commit": False, "fetch.wait.max.ms": 5}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    arrivals: list[Arrival] = []
    ids: set[str] = set()
    try:
        resumed = time.monotonic()
        client.resume(name)
        deadline = resumed + 120 + rows / 100
        while len(ids) < rows:
            if time.monotonic() > deadline:
                state = client.state(name)
                raise KinboxError(
                    f"Debezium: {len(ids)} of {rows} rows in {topic} after "
                    f"{time.monotonic() - resumed:.0f}s (connector {state.connector}, "
                    f"tasks {', '.join(state.tasks)})\n" + "\n".join(state.errors)
                )
            for message in consumer.consume(500, 0.1):
                arrival = _arrival(message)
                if arrival is None:
                    continue
                if not arrivals:
                    result.notes["resume_to_first_s"] = round(time.monotonic() - resumed, 2)
                arrivals.append(arrival)
                ids.add(arrival.event_id)
            ctx.tick(len(ids) / rows)
        result.seconds = time.monotonic() - resumed
        result.notes["resume_to_last_s"] = round(result.seconds, 2)
        # A moment more, so repeats right behind the last record are counted too.
        linger = time.monotonic() + 1.0
        while time.monotonic() < linger:
            arrivals += [a for a in map(_arrival, consumer.consume(500, 0.1)) if a is not None]
    finally:
        consumer.close()
    return arrivals


def _arrival(message: Message) -> Arrival | None:
    """A record as an :class:`Arrival`; ``None`` for a consumer event that is not a record."""
    if message.error():
        # A consumer event (a broker connection lost and retried), not a record;
        # one that lasts ends the read at its deadline, with Connect's state.
        return None
    try:
        event = event_id(message.headers())
    except ValueError as exc:
        raise CheckFailed(f"Debezium: {exc}") from None
    kind, stamp = message.timestamp()
    if kind != TIMESTAMP_LOG_APPEND_TIME:
        raise KinboxError("the CDC topic does not keep LogAppendTime: no broker clock to time")
    key = message.key()
    return Arrival(
        event_id=event,
        key=key.decode() if key is not None else None,
        n=int(json.loads(message.value() or b"{}")["n"]),
        partition=int(message.partition() or 0),
        offset=int(message.offset() or 0),
        appended_ms=int(stamp),
    )


def _remove(client: ConnectClient, conn: psycopg.Connection[Any], name: str, slot: str) -> None:
    """Delete the connector, then its slot and publication (Debezium keeps both).

    On the failure path too; what cannot be removed here (Connect gone, say)
    is left to the namespace's cleanup, which reports it, so that an error
    here never hides the run's own.
    """
    with contextlib.suppress(KinboxError):
        client.delete(name)  # never registered, or already gone
    with contextlib.suppress(KinboxError, psycopg.Error):
        drop_slot(conn, slot)
        conn.execute(sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(slot)))
