"""Helpers for the typed-payload, SQLAlchemy and Schema Registry tests (real broker, real DB)."""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import Producer
from psycopg import sql

Value = tuple[str, bytes]
"""``(event id, value)`` of one record to produce."""


def produce_values(
    bootstrap: str, topic: str, records: Sequence[Value], *, partition: int = 0
) -> None:
    """Send each ``(event_id, value)`` to ``topic``'s ``partition`` in order, with its id."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for event_id, value in records:
        producer.produce(
            topic, value=value, partition=partition, headers=[("event-id", event_id.encode())]
        )
    assert producer.flush(30) == 0


def insert_effect(schema: str) -> sql.Composed:
    """``INSERT INTO <schema>.effects`` of ``(consumer, event_id, topic, partition, offset)``."""
    return sql.SQL(
        'INSERT INTO {}.effects (consumer, event_id, topic, partition, "offset", pid)'
        " VALUES (%s, %s, %s, %s, %s, 0)"
    ).format(sql.Identifier(schema))
