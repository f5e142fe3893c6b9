"""Several relays at once, and a relay SIGKILLed mid-batch (real processes, real signals)."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter, defaultdict
from contextlib import ExitStack

import pytest

from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.support.database import Conn
from tests.support.outbox import (
    Received,
    assert_key_order,
    consume,
    count,
    enqueue_many,
    migrate_outbox,
    relay_process,
    running_relay,
)
from tests.support.waiting import wait_for


def _assert_key_order(received: list[Received]) -> None:
    """Per key, the first delivery of each event comes in write order, all on one partition."""
    assert_key_order(received)
    partitions: dict[str | None, set[int]] = defaultdict(set)
    for record in received:
        partitions[record.key].add(record.partition)
    assert all(len(p) == 1 for p in partitions.values())


@pytest.mark.parametrize("relays", [2, 3])
def test_several_relays_lose_nothing_duplicate_nothing_keep_key_order(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, relays: int
) -> None:
    migrate_outbox(db, schema)
    topic = make_topic(partitions=3)
    writers, keys_per_writer, per_key = 3, 4, 40
    total = writers * keys_per_writer * per_key

    def write(w: int) -> None:
        items = [(f"w{w}-k{k}", n) for n in range(per_key) for k in range(keys_per_writer)]
        enqueue_many(stack.database_url, schema, topic, items)

    with ExitStack() as running:
        # Given relays joining one after another while writers keep committing
        threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for thread in threads:
            thread.start()
        for _ in range(relays):
            running.enter_context(running_relay(stack, schema, lanes=8, batch_size=20))
            time.sleep(0.7)  # lanes are rebalanced while rows flow
        for thread in threads:
            thread.join()
        wait_for(lambda: count(db, schema, "status = 'sent'") == total, timeout=90)
    # Then every row is in Kafka exactly once, and each key kept its order
    received = consume(stack, topic, total, linger=2.0)
    ids = Counter(r.event_id for r in received)
    assert len(ids) == total
    assert max(ids.values()) == 1, "duplicates in normal operation"
    _assert_key_order(received)


def test_relay_killed_between_publish_and_commit_loses_nothing(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    migrate_outbox(db, schema)
    topic = make_topic(partitions=3)
    batch = 25
    items: list[tuple[str | None, int]] = [(f"k{n % 7}", n) for n in range(300)]
    enqueue_many(stack.database_url, schema, topic, items)
    # Given a relay that SIGKILLs itself after its 3rd batch was acked by Kafka
    # but before the batch was marked sent and committed
    crashed = relay_process(
        stack,
        schema,
        "--batch-size",
        str(batch),
        "--lanes",
        "4",
        env={"KINBOX_FAILPOINTS": "relay_after_publish=kill@3"},
    )
    assert crashed.wait(timeout=60) == -signal.SIGKILL
    assert count(db, schema, "status = 'pending'") > 0
    # When a fresh relay starts
    restarted = relay_process(stack, schema, "--batch-size", str(batch), "--lanes", "4")
    try:
        wait_for(lambda: count(db, schema, "status = 'sent'") == len(items), timeout=60)
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert restarted.wait(timeout=30) == 0  # graceful shutdown
    # Then every committed row is in Kafka, duplicates at most one batch, key order kept
    received = consume(stack, topic, len(items), linger=2.0)
    ids = Counter(r.event_id for r in received)
    assert len(ids) == len(items)
    duplicates = sum(n - 1 for n in ids.values())
    assert 1 <= duplicates <= batch
    _assert_key_order(received)
