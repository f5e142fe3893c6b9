"""Group members joining and leaving mid-stream: every effect once, order kept per partition."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from typing import Any

import pytest

from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.integration.inbox_support import (
    Produced,
    assert_offsets_not_ahead,
    committed,
    effects,
    produce,
    start_worker,
)
from tests.support.database import Conn, prepare_schema
from tests.support.launch import FAST_GROUP
from tests.support.waiting import wait_for

PARTITIONS = 6
EVENTS = 1200

PROTOCOLS = {
    "cooperative-sticky": FAST_GROUP,
    "eager": {**FAST_GROUP, "partition.assignment.strategy": "range"},
    "kip848": {"group.protocol": "consumer"},
}


@pytest.mark.parametrize("protocol", sorted(PROTOCOLS))
def test_third_member_joins_and_leaves_mid_stream(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, protocol: str
) -> None:
    topic = make_topic(partitions=PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    addr = (stack.bootstrap_servers, stack.database_url, topic, group, schema)
    options: dict[str, Any] = {"sleep": 0.002, "kafka": PROTOCOLS[protocol]}
    produced: Produced = {}

    def producer() -> None:
        # A steady stream, so rebalances happen while events flow.
        for start in range(0, EVENTS, 60):
            batch = [(f"e{i}", i % PARTITIONS) for i in range(start, start + 60)]
            produce(stack.bootstrap_servers, topic, batch, produced)
            time.sleep(0.1)

    # Given two members (one process running two) and a stream of events
    members = start_worker(*addr, processes=2, **options)
    stream = threading.Thread(target=producer)
    stream.start()
    try:
        time.sleep(3)
        # When a third member joins and, a few seconds later, leaves
        third = start_worker(*addr, **options)
        time.sleep(5)
        third.send_signal(signal.SIGTERM)
        assert third.wait(60) == 0
        stream.join(120)
        wait_for(
            lambda: (
                sum(committed(stack.bootstrap_servers, group, topic, PARTITIONS).values()) == EVENTS
            ),
            timeout=120,
            what="every offset committed",
        )
    finally:
        members.send_signal(signal.SIGTERM)
        assert members.wait(60) == 0

    rows = effects(db, schema)
    # Then every event's effect happened exactly once
    assert len(rows) == EVENTS
    assert {row[1] for row in rows} == {f"e{i}" for i in range(EVENTS)}
    # and, per partition, effects were applied in offset order
    for partition in range(PARTITIONS):
        offsets = [row[3] for row in rows if row[2] == partition]
        assert offsets == sorted(offsets), f"partition {partition} applied out of order"
    # and the work was really shared (the third member took part)
    assert len({row[4] for row in rows}) >= 3
    assert_offsets_not_ahead(
        db, schema, stack.bootstrap_servers, group, topic, PARTITIONS, produced
    )
