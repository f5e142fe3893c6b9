"""Inbox throughput: the source article's per-event design against kinbox's batches.

All three consumers read the same events from a real broker and write one
effect row per event into a real PostgreSQL with ``fsync`` on (a benchmark
measures durable commits). Figures are end to end: from the first poll until
the last effect is committed in the database.

- ``naive``: the article's design: per event, BEGIN; SELECT EXISTS in
  processed_events; INSERT it; the effect; COMMIT; commit the offset.
- ``kinbox``: ``@handler`` per event: one transaction per partition batch, one
  set-based claim, the handlers one after another (no savepoint unless one fails).
- ``kinbox batch``: ``@handler(batch=True)``: the same with one set-based
  effect statement per batch.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kinbox import App, Event
from kinbox.inbox_schema import INBOX
from kinbox.kafka import KafkaTransport
from kinbox.migrations import migrate
from kinbox.runner import Runner
from kinbox.store import PostgresInboxStore

PARTITIONS = 3


def produce(bootstrap: str, topic: str, count: int) -> None:
    """Write ``count`` events with unique ``event-id`` headers over the topic's partitions."""
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[
        topic
    ].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for n in range(count):
        producer.produce(
            topic,
            b'{"userId": "u%d", "lessonId": "l%d"}' % (n % 1000, n),
            key=str(n % 97).encode(),
            headers={"event-id": str(uuid.uuid4())},
        )
        if n % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def _count(url: str, table: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
        return int(row[0]) if row else 0


def naive(bootstrap: str, url: str, topic: str, count: int) -> float:
    """The article's consumer; returns seconds for ``count`` events."""
    table = f"bench.effect_naive_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench.naive_processed (event_id text PRIMARY KEY)")
        conn.execute(f"CREATE TABLE {table} (user_id text, lesson_id text)")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"naive-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    done = 0
    start = None
    with psycopg.connect(url) as conn:
        while done < count:
            message = consumer.poll(1.0)
            if message is None or message.error():
                continue
            start = start or time.perf_counter()
            raw_id = dict(message.headers() or [])["event-id"]
            event_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            exists = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM bench.naive_processed WHERE event_id = %s)",
                (event_id,),
            ).fetchone()
            if exists and not exists[0]:
                conn.execute(
                    "INSERT INTO bench.naive_processed VALUES (%s)",
                    (event_id,),
                )
                conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", ("u", "l"))
            conn.commit()
            consumer.commit(message=message, asynchronous=False)
            done += 1
    consumer.close()
    return time.perf_counter() - (start or time.perf_counter())


def kinbox_run(
    bootstrap: str, url: str, topic: str, count: int, *, batch: bool, batch_size: int = 500
) -> float:
    """Run kinbox's runner in-process until ``count`` effects are committed; returns seconds."""
    table = f"bench.effect_{'batch' if batch else 'each'}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (user_id text, lesson_id text)")
    group = f"kinbox-{uuid.uuid4().hex[:6]}"
    app = App(group_id=group, schema="bench", batch_max_messages=batch_size)
    insert = f"INSERT INTO {table} VALUES (%s, %s)"
    handler: Callable[..., Any]
    if batch:

        def handler(events: list[Event], tx: psycopg.Connection[Any]) -> None:
            rows = [e.json() for e in events]
            tx.execute(
                f"INSERT INTO {table} SELECT * FROM unnest(%s::text[], %s::text[])",
                ([r["userId"] for r in rows], [r["lessonId"] for r in rows]),
            )
    else:

        def handler(event: Event, tx: psycopg.Connection[Any]) -> None:
            payload = event.json()
            tx.execute(insert, (payload["userId"], payload["lessonId"]))

    app.handler(topic, batch=batch)(handler)
    settings = app.settings({"bootstrap_servers": bootstrap, "database_url": url}, {}).validate()
    store = PostgresInboxStore(url, schema="bench", consumer=group)
    store.open()
    runner = Runner(app, settings, KafkaTransport(settings), store)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    # Like the naive run's clock, start at the first effect, not at the group join.
    while (seen := _count(url, table)) == 0:
        time.sleep(0.01)
    start, first = time.perf_counter(), seen
    while _count(url, table) < count:
        time.sleep(0.05)
    elapsed = time.perf_counter() - start
    runner.stop()
    thread.join(60)
    # ``elapsed`` covered the events after the first batch: scale to all of them.
    return elapsed * count / max(1, count - first)


Row = tuple[str, int, float]


def run(bootstrap: str, url: str, *, events: int, naive_events: int) -> list[Row]:
    """Run the three consumers; return ``(name, events, seconds)`` rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS bench CASCADE")
        migrate(conn, "bench", [INBOX])
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, events)
    return [
        ("naive (article): txn + offset commit per event", naive_events,
         naive(bootstrap, url, topic, naive_events)),
        ("kinbox @handler (per event, batched txn)", events,
         kinbox_run(bootstrap, url, topic, events, batch=False)),
        ("kinbox @handler(batch=True)", events,
         kinbox_run(bootstrap, url, topic, events, batch=True)),
    ]  # fmt: skip
