"""Outbox relay: throughput of a backlog, and latency from COMMIT to the record in Kafka.

- ``backlog``: N rows are committed first (200 keys), then one relay publishes
  them all; rows/s from the relay's start until the last row is marked sent.
- ``latency``: rows are committed one at a time, slowly, while the relay runs;
  for each, the time from the writer's COMMIT until a consumer holds the record.
  Once with LISTEN/NOTIFY (the relay wakes on commit), once with NOTIFY
  disabled, so only the poll interval wakes it — the fallback's cost.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from kinbox.migrations import migrate
from producer_outbox import enqueue
from producer_outbox.config import RelayConfig
from producer_outbox.publisher import KafkaPublisher, producer_config
from producer_outbox.relay import Relay
from producer_outbox.schema import OUTBOX

SCHEMA = "bench_outbox"
Row = tuple[str, int, float, str]


@contextmanager
def _relay(bootstrap: str, url: str, **settings: Any) -> Iterator[Relay]:
    publisher = KafkaPublisher(producer_config(bootstrap, {}))
    relay = Relay(RelayConfig(database_url=url, schema=SCHEMA, **settings), publisher)
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        relay.stop()
        thread.join(60)
        publisher.close()


def _unsent(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.outbox WHERE status <> 'sent'").format(
                sql.Identifier(SCHEMA)
            )
        ).fetchone()
        return int(row[0]) if row else -1


def backlog(bootstrap: str, url: str, topic: str, rows: int) -> float:
    """Seconds for one relay to publish ``rows`` committed rows."""
    with psycopg.connect(url) as conn, conn.transaction():
        for n in range(rows):
            enqueue(conn, topic, {"n": n, "pad": "x" * 64}, key=f"k{n % 200}", schema=SCHEMA)
    start = time.perf_counter()
    with _relay(bootstrap, url, batch_size=500, poll_interval=0.5):
        while _unsent(url):
            time.sleep(0.02)
        elapsed = time.perf_counter() - start
    return elapsed


def latency(bootstrap: str, url: str, topic: str, samples: int, *, notify: bool) -> list[float]:
    """COMMIT → consumer latencies in seconds, one row at a time."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "latency", "fetch.wait.max.ms": 5}
    )
    # Start exactly at the current end: a group's "latest" is resolved lazily and
    # could miss the first records produced right after subscribing.
    ends = [
        TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1])
        for p in range(3)
    ]
    consumer.assign(ends)
    results: list[float] = []
    with (
        _relay(bootstrap, url, poll_interval=0.5) as _,
        psycopg.connect(url, autocommit=True) as conn,
    ):
        for n in range(samples):
            marker = uuid.uuid4().hex
            if notify:
                with conn.transaction():
                    enqueue(conn, topic, {"marker": marker}, key="lat", schema=SCHEMA)
            else:
                # The same row without the writer's pg_notify: only polling finds it.
                with conn.transaction():
                    conn.execute(
                        sql.SQL(
                            "INSERT INTO {}.outbox (id, topic, aggregatetype, aggregateid, payload)"
                            " VALUES (%s, %s, %s, 'lat', jsonb_build_object('marker', %s::text))"
                        ).format(sql.Identifier(SCHEMA)),
                        (uuid.uuid4(), topic, topic, marker),
                    )
            committed = time.perf_counter()
            while True:
                message = consumer.poll(0.01)
                if (
                    message is not None
                    and not message.error()
                    and marker.encode() in (message.value() or b"")
                ):
                    results.append(time.perf_counter() - committed)
                    break
            time.sleep(0.05 + (n % 7) * 0.03)  # spread commits over the poll cycle
    consumer.close()
    return results


def run(bootstrap: str, url: str, *, rows: int, samples: int) -> list[Row]:
    """Run both measurements; return ``(name, count, value, unit)`` rows."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
        migrate(conn, SCHEMA, [OUTBOX])
    topic = f"bench-outbox-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the future
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(30)
    seconds = backlog(bootstrap, url, topic, rows)
    with_notify = latency(bootstrap, url, topic, samples, notify=True)
    polling = latency(bootstrap, url, topic, samples, notify=False)

    def ms(values: list[float], q: float) -> float:
        return 1000 * statistics.quantiles(values, n=100)[int(q) - 1]

    return [
        ("outbox relay, backlog (one relay)", rows, rows / seconds, "rows/s"),
        ("commit → consumer, LISTEN/NOTIFY, p50", samples, ms(with_notify, 50), "ms"),
        ("commit → consumer, LISTEN/NOTIFY, p99", samples, ms(with_notify, 99), "ms"),
        ("commit → consumer, polling 0.5 s only, p50", samples, ms(polling, 50), "ms"),
        ("commit → consumer, polling 0.5 s only, p99", samples, ms(polling, 99), "ms"),
    ]
