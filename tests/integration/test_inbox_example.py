"""examples/lessons: CompleteLesson publishes, the handler applies progress exactly once."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from examples.lessons.app import TOPIC, app, complete_lesson, create_tables
from kinbox.devstack.stack import Stack
from tests.integration.inbox_support import (
    Conn,
    committed,
    prepare_schema,
    running,
    settings,
    wait_for,
)


def test_lessons_example_applies_each_completion_once_despite_duplicates(
    stack: Stack, schema: str, db: Conn
) -> None:
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})
    if TOPIC not in admin.list_topics(timeout=10).topics:
        admin.create_topics([NewTopic(TOPIC, num_partitions=3, replication_factor=1)])[
            TOPIC
        ].result(30)
    # The example uses unqualified table names: give it a private search_path.
    url = f"{stack.database_url}?options={quote(f'-c search_path={schema}')}"
    prepare_schema(stack.database_url, schema)
    group = f"progress-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
    with psycopg.connect(url, autocommit=True) as conn:
        create_tables(conn)
        ids = [complete_lesson(conn, producer, f"u{n % 3}", f"l{n}") for n in range(9)]
    # Duplicates on purpose: the same events (same event-id) published again.
    assert producer.flush(30) == 0
    for event_id in ids[:4]:
        producer.produce(TOPIC, key=b"dup", value=b'{"userId": "u0", "lessonId": "l0"}',
                         headers=[("event-id", event_id.encode())])  # fmt: skip
    assert producer.flush(30) == 0
    end = sum(_end_offsets(stack.bootstrap_servers).values())

    config = settings(stack.bootstrap_servers, url, group, schema)
    with running(app, config):
        wait_for(
            lambda: sum(committed(stack.bootstrap_servers, group, TOPIC, 3).values()) == end,
            what="every lesson event consumed",
        )
    s = sql.Identifier(schema)
    applied = db.execute(
        sql.SQL(
            "SELECT count(*), count(DISTINCT event_id) FROM {}.lesson_applications"
            " WHERE event_id = ANY(%s)"
        ).format(s),
        (ids,),
    ).fetchone()
    assert applied == (9, 9)  # 13 deliveries of our events, 9 applications
    pairs = db.execute(
        sql.SQL("SELECT user_id, lesson_id FROM {}.lesson_progress").format(s)
    ).fetchall()
    assert {(f"u{n % 3}", f"l{n}") for n in range(9)} <= set(pairs)


def _end_offsets(bootstrap: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe"})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
            for p in range(3)
        }
    finally:
        consumer.close()
