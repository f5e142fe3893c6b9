"""What the hand-written contenders share: stopping on a signal, reading a record, the SQL.

The hand-written contenders keep their processed-event rows in the same table
kinbox does (``<schema>.processed_events``, keyed on consumer group and event
id) and write the same columns, so every contender pays for the same row in
the same index, and the large-table scenario loads one table for all.
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from confluent_kafka import Message
from psycopg import sql

from kinbox.bench.spec import ChildSpec
from kinbox.bench.workload import ID_HEADER


class StopFlag:
    """Set by the first SIGTERM/SIGINT: finish the batch in hand, commit, leave the group."""

    def __init__(self) -> None:
        self.event = threading.Event()
        signal.signal(signal.SIGTERM, self._set)
        signal.signal(signal.SIGINT, self._set)

    def _set(self, _signum: int, _frame: FrameType | None) -> None:
        self.event.set()

    def __bool__(self) -> bool:
        return self.event.is_set()


def consumer_config(spec: ChildSpec) -> dict[str, Any]:
    """A plain confluent-kafka consumer as a team would configure one: manual commits."""
    return {
        "bootstrap.servers": spec.bootstrap_servers,
        "group.id": spec.group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        **spec.kafka,
    }


def event_id(headers: Any) -> str:
    """The ``event-id`` header (every benchmark record has one)."""
    for key, value in headers or ():
        if key == ID_HEADER and value is not None:
            return value.decode() if isinstance(value, bytes) else str(value)
    raise ValueError("record without an event-id header")


def effect_row(event: str, partition: int, offset: int, value: bytes | None) -> tuple[Any, ...]:
    """The effect row's parameters (see :data:`kinbox.bench.effects.COLUMNS`)."""
    body = json.loads(value or b"{}")
    return (event, partition, offset, body["userId"], body["lessonId"], body["sentAt"])


def message_row(msg: Message) -> tuple[Any, ...]:
    """:func:`effect_row` of a consumed message."""
    return effect_row(
        event_id(msg.headers()), int(msg.partition() or 0), int(msg.offset() or 0), msg.value()
    )


def claim_one(schema: str) -> sql.Composed:
    """Claim one event: a row back means it is fresh (``INSERT … ON CONFLICT DO NOTHING``)."""
    return sql.SQL(
        'INSERT INTO {}.processed_events (consumer, event_id, topic, partition, "offset")'
        " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING event_id"
    ).format(sql.Identifier(schema))


def claim_many(schema: str) -> sql.Composed:
    """Claim many events in one statement; returns the fresh ids."""
    return sql.SQL(
        'INSERT INTO {}.processed_events (consumer, event_id, topic, partition, "offset")'
        " SELECT %s, * FROM unnest(%s::text[], %s::text[], %s::int[], %s::bigint[])"
        " ON CONFLICT DO NOTHING RETURNING event_id"
    ).format(sql.Identifier(schema))


def columns(rows: Sequence[tuple[Any, ...]]) -> list[list[Any]]:
    """Rows to one list per column, for ``unnest``."""
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[]] * 6
