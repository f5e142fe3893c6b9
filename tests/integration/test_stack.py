"""The local stack: a record goes Kafka → consumer group → PostgreSQL, read back from both."""

from __future__ import annotations

import uuid

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic


def test_record_goes_through_kafka_into_postgres(
    stack: Stack, make_topic: MakeTopic, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    # Given a topic with three records and a table to write them into
    topic = make_topic(partitions=1)
    table = f"seen_{uuid.uuid4().hex[:8]}"
    db.execute(f"CREATE TABLE {table} (value text PRIMARY KEY, kafka_offset bigint)")
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
    for i in range(3):
        producer.produce(topic, f"record-{i}".encode())
    assert producer.flush(30) == 0

    # When a consumer group reads them and writes each to PostgreSQL, then commits
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(
        {
            "bootstrap.servers": stack.bootstrap_servers,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen = 0
    for _ in range(60):
        message = consumer.poll(1.0)
        if message is None or message.error():
            continue
        db.execute(
            f"INSERT INTO {table} VALUES (%s, %s)",
            ((message.value() or b"").decode(), message.offset()),
        )
        consumer.commit(message=message, asynchronous=False)
        seen += 1
        if seen == 3:
            break
    consumer.close()

    # Then the database holds the three records and the broker the committed offset
    rows = db.execute(f"SELECT value FROM {table} ORDER BY kafka_offset").fetchall()
    assert [r[0] for r in rows] == ["record-0", "record-1", "record-2"]
    checker = Consumer({"bootstrap.servers": stack.bootstrap_servers, "group.id": group})
    committed = checker.committed([TopicPartition(topic, 0)], timeout=10)
    checker.close()
    assert committed[0].offset == 3


def test_postgres_restart_immediate_keeps_committed_rows(
    stack: Stack, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    if stack.postgres is None:
        return  # external server: not ours to restart
    table = f"durable_{uuid.uuid4().hex[:8]}"
    db.execute(f"CREATE TABLE {table} (n int)")
    db.execute(f"INSERT INTO {table} VALUES (1)")
    old_pid = stack.postgres.pid
    stack.postgres.restart(immediate=True)
    assert stack.postgres.pid != old_pid
    with psycopg.connect(stack.database_url) as conn:
        assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (1,)
