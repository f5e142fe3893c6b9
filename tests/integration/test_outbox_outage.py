"""The relay under a PostgreSQL outage: it reconnects, and no committed row is lost."""

from __future__ import annotations

import json

import psycopg

from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.support.database import Conn
from tests.support.outbox import consume, count, enqueue_many, migrate_outbox, running_relay
from tests.support.waiting import wait_for

BATCH = 10


def _sent(database_url: str, schema: str) -> int:
    # A fresh connection each time: the server restarts under this test.
    with psycopg.connect(database_url, autocommit=True) as conn:
        return count(conn, schema, "status = 'sent'")


def test_relay_rides_out_an_immediate_postgres_restart(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    assert stack.postgres is not None, "this test restarts the server the session owns"
    topic = make_topic(partitions=3)
    migrate_outbox(db, schema)
    rows = [(f"k{n % 5}", n) for n in range(120)]
    with running_relay(stack, schema, batch_size=BATCH, backoff_base=0.2, backoff_max=1.0):
        # Given rows committed while the relay publishes them
        enqueue_many(stack.database_url, schema, topic, rows[:60])
        # When the server restarts as after a crash, mid-stream, and more rows follow
        stack.postgres.restart(immediate=True)
        enqueue_many(stack.database_url, schema, topic, rows[60:])
        wait_for(
            lambda: _sent(stack.database_url, schema) == len(rows),
            timeout=60,
            what="every row marked sent after the restart",
        )

    # Then every committed row reached Kafka, each key's rows first delivered in order
    received = consume(stack, topic, len(rows))
    assert len({r.event_id for r in received}) == len(rows)
    assert len(received) - len(rows) <= BATCH  # duplicates: at most the batch in flight
    seen: set[str] = set()
    firsts: dict[str | None, list[int]] = {}
    for record in sorted(received, key=lambda r: (r.partition, r.offset)):
        if record.event_id not in seen:
            seen.add(record.event_id)
            firsts.setdefault(record.key, []).append(json.loads(record.value)["n"])
    assert all(ns == sorted(ns) for ns in firsts.values()), firsts
