"""Helpers for the typed-payload, SQLAlchemy and Schema Registry tests (real broker, real DB)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any

import pydantic
from confluent_kafka import Producer
from psycopg import sql

from kinbox.app import App
from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.support.database import prepare_schema

Value = tuple[str, bytes]
"""``(event id, value)`` of one record to produce."""


class Order(pydantic.BaseModel):
    """A payload validated by pydantic."""

    order_id: str
    amount: int


@dataclasses.dataclass
class Line:
    """A payload built as a plain dataclass."""

    sku: str
    qty: int


def fresh_app(stack: Stack, make_topic: MakeTopic, schema: str, **app: Any) -> tuple[App, str, str]:
    """A one-partition topic, a group, the schema migrated: ``(app, topic, group)``."""
    topic = make_topic(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    return App(group_id=group, schema=schema, **app), topic, group


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
