"""While the broker keeps a dead letter waiting, the worker holds no PostgreSQL transaction.

docs/design.md invariant 5: nothing kinbox runs holds a transaction id while it
waits on Kafka. One held anywhere on the server holds back
``pg_snapshot_xmin``, which every outbox relay's claim filters on, so a
dead-letter topic whose broker does not answer would stall the relays of
every database on the server for as long as it lasts.

The worker (in a thread: real Kafka, real PostgreSQL) consumes from a broker
of this module's own, behind a TCP fault proxy (``proxied_broker``). A poison event's handler
waits until the test has blackholed the link, then gives the event up, so
its dead letter cannot be acknowledged. While the worker waits for the
broker, none of its sessions (told apart by ``application_name``) is in a
transaction, and an outbox row committed meanwhile is taken by the relay's
own claim. Once the link heals, the dead letter goes out, is recorded once,
and the partition drains.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import pytest

from kinbox.core.errors import DeadLetter
from kinbox.core.event import Event
from kinbox.devstack.stack import Stack
from producer_outbox.claim import claim
from producer_outbox.writer import enqueue
from tests.integration.failure_support import effect_app, running, statuses
from tests.integration.inbox_support import committed, effects, produce, settings
from tests.support.database import Conn, prepare_schema, with_application_name
from tests.support.outbox import migrate_outbox
from tests.support.proxied import ProxiedBroker
from tests.support.records import dead_letter_id, read_topic
from tests.support.topics import create_topic
from tests.support.waiting import wait_for

LANES = 4
SENDING = "dead-lettering"
"""What the worker logs as it hands a dead letter to the producer, before waiting for the ack."""


def _sessions(db: Conn, name: str) -> list[tuple[Any, ...]]:
    """``(pid, state, backend_xid, xact_start)`` of the sessions named ``name``."""
    return db.execute(
        "SELECT pid, state, backend_xid::text, xact_start FROM pg_stat_activity"
        " WHERE application_name = %s",
        (name,),
    ).fetchall()


def test_no_transaction_is_open_while_the_broker_keeps_a_dead_letter_waiting(
    proxied_broker: ProxiedBroker,
    stack: Stack,
    schema: str,
    db: Conn,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = proxied_broker.proxy
    bootstrap = proxied_broker.bootstrap_servers  # every connection goes through the proxy
    topic = create_topic(bootstrap, partitions=1)
    create_topic(bootstrap, f"{topic}.dlq", 1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    migrate_outbox(db, schema)
    held, go = threading.Event(), threading.Event()

    def before(event: Event) -> None:
        if event.id == "poison":
            held.set()
            go.wait(60)
            raise DeadLetter("cannot be applied")

    app = effect_app(topic, schema, group, before)
    name = f"worker-{group}"
    config = settings(bootstrap, with_application_name(stack.database_url, name), group, schema)
    with caplog.at_level(logging.ERROR, logger="kinbox.apply.deadletter"), running(app, config):
        produce(bootstrap, topic, [("warm-up", 0)])
        wait_for(lambda: committed(bootstrap, group, topic, 1) == {0: 1}, what="the warm-up")
        # Given a batch with a poison event, whose handler runs while the
        # broker can still be reached
        produce(bootstrap, topic, [("a1", 0), ("poison", 0), ("a2", 0)])
        wait_for(held.is_set, what="the poison event's handler")
        # When the link to the broker goes dark, and then the event is given up
        proxy.set_blackhole()
        try:
            go.set()
            wait_for(lambda: SENDING in caplog.text, what="the dead letter handed to the producer")
            # Then, while the worker waits for the broker's acknowledgement,
            # none of its sessions is in a transaction or holds an id
            for _ in range(5):
                sessions = _sessions(db, name)
                assert sessions, "the worker's sessions are not named"
                assert all(s[2] is None and s[3] is None for s in sessions), sessions
                time.sleep(0.2)
            # ... so an outbox row committed now is claimable at once: the
            # relay's claim (pg_snapshot_xmin) waits for no one of the worker's
            with db.transaction():
                row = enqueue(db, "elsewhere", {"n": 1}, schema=schema)
            claimed = claim(db, schema, owned=range(LANES), lanes=LANES, limit=10)
            assert str(row) in {r.id for r in claimed}, claimed
            # ... and the worker was still waiting: nothing of the batch is recorded
            assert not {"a1", "poison", "a2"} & set(statuses(db, schema, group))
        finally:
            proxy.set_pass()
        # When the link heals, the dead letter goes out and the partition drains
        wait_for(lambda: committed(bootstrap, group, topic, 1) == {0: 4}, what="the partition")

    assert statuses(db, schema, group)["poison"][0] == "dead_lettered"
    assert sorted(row[1] for row in effects(db, schema)) == ["a1", "a2", "warm-up"]
    letters = read_topic(bootstrap, f"{topic}.dlq")
    assert [dead_letter_id(letter) for letter in letters] == ["poison"]
