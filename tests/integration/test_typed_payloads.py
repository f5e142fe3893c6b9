"""Typed payloads against the real broker and database: decoded, applied once, or dead-lettered."""

from __future__ import annotations

import json
from typing import Any

from kinbox.core.event import Event
from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.integration.failure_support import dead_letters, header, running, statuses
from tests.integration.inbox_support import committed, effects, settings
from tests.integration.typed_support import Line, Order, fresh_app, insert_effect, produce_values
from tests.support.database import Conn
from tests.support.waiting import wait_for


def test_a_pydantic_payload_is_applied_once_and_an_invalid_one_dead_lettered_at_once(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # Given a handler that asks for an Order (and the event), five tries per event
    app, topic, group = fresh_app(stack, make_topic, schema)
    seen: list[tuple[str, int]] = []

    @app.handler(topic, max_attempts=5)
    def apply(order: Order, tx: Any, event: Event) -> None:
        seen.append((order.order_id, order.amount))
        tx.execute(
            insert_effect(schema), (group, event.id, event.topic, event.partition, event.offset)
        )

    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    good = json.dumps({"order_id": "o1", "amount": 3}).encode()
    produce_values(
        stack.bootstrap_servers,
        topic,
        [
            ("e1", good),
            ("bad", b'{"order_id": "o2", "amount": "many"}'),
            ("e2", json.dumps({"order_id": "o3", "amount": 4}).encode()),
            ("e1", good),  # the same event again
        ],
    )

    # When a worker consumes them
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 4})

    # Then the good ones are applied once, the bad one dead-lettered on its first try
    assert [row[1] for row in effects(db, schema)] == ["e1", "e2"]
    # (e1 ran twice: the bad event abandoned the optimistic pass, which was redone
    # carefully; the first run's work went with its rollback)
    assert set(seen) == {("o1", 3), ("o3", 4)}
    status = statuses(db, schema, group)
    assert status["bad"][0] == "dead_lettered"
    assert (status["bad"][1] or "").startswith("payload: InvalidPayload: ")
    [letter] = dead_letters(config, f"{topic}.dlq")
    assert header(letter, "event-id") == "bad"
    assert header(letter, "kinbox.dlq.reason") == "payload"
    assert header(letter, "kinbox.dlq.attempts") == "1"
    message = header(letter, "kinbox.dlq.error.message") or ""
    assert "1 validation error for Order" in message and "amount" in message
    assert letter.value == b'{"order_id": "o2", "amount": "many"}'


def test_a_typed_batch_handler_with_its_own_deserializer(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # Given a batch handler of dataclasses, whose values are "sku:qty" text
    app, topic, group = fresh_app(stack, make_topic, schema)

    def parse(raw: bytes) -> dict[str, object]:
        sku, qty = raw.decode().split(":")  # "garbage" has no ":": a ValueError
        return {"sku": sku, "qty": int(qty)}

    @app.handler(topic, batch=True, value_deserializer=parse)
    def apply(lines: list[Line], tx: Any, events: list[Event]) -> None:
        for line, event in zip(lines, events, strict=True):
            assert isinstance(line, Line)
            tx.execute(
                insert_effect(schema),
                (group, f"{event.id}:{line.sku}x{line.qty}", event.topic, 0, event.offset),
            )

    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    records = [(f"e{i}", f"sku{i}:{i}".encode()) for i in range(4)]
    records.insert(2, ("bad", b"garbage"))
    produce_values(stack.bootstrap_servers, topic, records)

    # When a worker consumes them
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 5})

    # Then every good line is applied, the bad value dead-lettered with reason payload
    assert sorted(row[1] for row in effects(db, schema)) == [f"e{i}:sku{i}x{i}" for i in range(4)]
    assert statuses(db, schema, group)["bad"][0] == "dead_lettered"
    [letter] = dead_letters(config, f"{topic}.dlq")
    assert header(letter, "kinbox.dlq.reason") == "payload"
    assert "ValueError" in (header(letter, "kinbox.dlq.error.message") or "")
