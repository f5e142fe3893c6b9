"""Inbox → outbox chaining: a handler writes outbox rows in the inbox transaction.

The chained event commits with the effect that caused it, or not at all, so a
service in the middle of a pipeline is exactly-once in effect on both sides.
"""

from __future__ import annotations

import uuid
from typing import Any

from psycopg import sql

from kinbox import App, Event
from kinbox.devstack.stack import Stack
from kinbox.store.migrations import migrate
from producer_outbox import enqueue
from producer_outbox.schema import OUTBOX
from tests.conftest import MakeTopic
from tests.integration.inbox_support import effects, produce, running, settings
from tests.support.database import Conn, prepare_schema
from tests.support.outbox import count, running_relay
from tests.support.waiting import wait_for

_CHAIN = uuid.UUID("6f1c1c4e-0000-4000-8000-00000000c4a1")


def test_handler_enqueues_in_the_inbox_transaction_and_downstream_applies_once(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # Given a middle service (orders → invoices) whose handler fails once, after
    # it has enqueued, for one event; and a downstream service on invoices
    orders, invoices = make_topic(partitions=2), make_topic(partitions=2)
    prepare_schema(stack.database_url, schema)
    migrate(db, schema, [OUTBOX])
    middle = App(group_id=f"billing-{uuid.uuid4().hex[:6]}", schema=schema)
    downstream_group = f"ledger-{uuid.uuid4().hex[:6]}"
    downstream = App(group_id=downstream_group, schema=schema)
    ids = [f"order-{n}" for n in range(30)]
    failed_once: set[str] = set()
    insert = sql.SQL(
        'INSERT INTO {}.effects (consumer, event_id, topic, partition, "offset", pid)'
        " VALUES (%s, %s, %s, %s, %s, 0)"
    ).format(sql.Identifier(schema))

    @middle.handler(orders)
    def bill(event: Event, tx: Any) -> None:
        # The downstream id derives from the upstream one: a redo yields the same id.
        enqueue(tx, invoices, {"order": event.id}, key=event.id,
                event_id=uuid.uuid5(_CHAIN, event.id), schema=schema)  # fmt: skip
        if event.id == "order-7" and event.id not in failed_once:
            failed_once.add(event.id)
            raise RuntimeError("tax service timed out")  # rolls back the enqueue too

    @downstream.handler(invoices)
    def book(event: Event, tx: Any) -> None:
        tx.execute(insert, (downstream_group, event.json()["order"], event.topic,
                            event.partition, event.offset))  # fmt: skip

    # When the orders arrive, some of them twice
    produce(stack.bootstrap_servers, orders, [(i, n % 2) for n, i in enumerate(ids)])
    produce(stack.bootstrap_servers, orders, [(i, 0) for i in ids[:10]])
    config = settings(stack.bootstrap_servers, stack.database_url, middle.settings().group_id,
                      schema)  # fmt: skip
    down_config = settings(stack.bootstrap_servers, stack.database_url, downstream_group, schema)
    with (
        running(middle, config),
        running_relay(stack, schema),
        running(downstream, down_config),
    ):
        wait_for(lambda: len(effects(db, schema, downstream_group)) >= len(ids),
                 what="every invoice booked")  # fmt: skip
        wait_for(lambda: count(db, schema, "status = 'sent'") == len(ids), what="outbox drained")

    # Then one outbox row per distinct order (the failed attempt left none),
    # and downstream applied each invoice once
    assert failed_once == {"order-7"}
    assert count(db, schema) == len(ids)
    booked = [row[1] for row in effects(db, schema, downstream_group)]
    assert sorted(booked) == sorted(ids)
