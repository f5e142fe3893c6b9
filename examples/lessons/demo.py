"""The README's demo: an event goes through a real local Kafka broker into PostgreSQL."""

from __future__ import annotations

import uuid

import psycopg
from confluent_kafka import Consumer, Producer

from kinbox.devstack.stack import local_stack


def main() -> None:
    """Start the local stack, send one lesson event through it, print what arrived."""
    with local_stack(use_external=False) as stack:
        print(stack.describe())
        event_id = str(uuid.uuid4())
        producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
        producer.produce("lesson-events", b'{"userId": "u1", "lessonId": "l1"}',
                         headers={"event-id": event_id})  # fmt: skip
        producer.flush(30)
        settings = {"bootstrap.servers": stack.bootstrap_servers, "group.id": "demo"}
        consumer = Consumer({**settings, "auto.offset.reset": "earliest"})
        consumer.subscribe(["lesson-events"])
        with psycopg.connect(stack.database_url) as conn:
            conn.execute("CREATE TABLE seen (event_id text PRIMARY KEY, payload text)")
            while (message := consumer.poll(1.0)) is None or message.error():
                pass
            conn.execute("INSERT INTO seen VALUES (%s, %s)", (event_id, message.value()))
            conn.commit()
            consumer.commit(message=message, asynchronous=False)
            print("in PostgreSQL:", conn.execute("SELECT * FROM seen").fetchall())
        consumer.close()


if __name__ == "__main__":
    main()
