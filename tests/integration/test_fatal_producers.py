"""A producer that goes fatal for real is replaced: the dead-letter publisher and the relay's.

The trigger is real, not simulated: with ``enable.gapless.guarantee=true``
an idempotent librdkafka producer raises a *fatal* error when the broker
refuses a batch permanently, and a topic whose ``max.message.bytes`` is
smaller than the record makes the broker do exactly that
(``MSG_SIZE_TOO_LARGE``). After that the old producer refuses every call
with ``_FATAL``; only a new one can publish again. The session broker is
not disturbed, so these tests share it.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from kinbox.core.config import Settings
from kinbox.core.errors import TransportError
from kinbox.core.publisher import OutgoingRecord, deliver
from kinbox.devstack.stack import Stack
from kinbox.kafka import dead_letter_publisher, read_topic
from producer_outbox.producer import producer_config, relay_publisher
from producer_outbox.relay import Relay
from producer_outbox.writer import enqueue
from tests.conftest import MakeTopic
from tests.integration.failure_support import header, poison_app, running, statuses
from tests.integration.inbox_support import committed, effects, settings
from tests.support.database import Conn, prepare_schema
from tests.support.outbox import consume, migrate_outbox, relay_config
from tests.support.records import set_max_message_bytes
from tests.support.topics import create_topic
from tests.support.waiting import wait_for

GAPLESS = {"enable.gapless.guarantee": "true"}
LIMIT = 1024
"""``max.message.bytes`` of the small topics: a 3 KB record is refused by the broker."""


def small_topic(stack: Stack, name: str) -> str:
    return create_topic(stack.bootstrap_servers, name, 1, config={"max.message.bytes": str(LIMIT)})


def raise_limit(stack: Stack, topic: str) -> None:
    """What an operator does once the dead letters are seen not to fit."""
    set_max_message_bytes(stack.bootstrap_servers, topic, 1048576)


def test_dead_letter_publisher_replaces_the_producer_that_went_fatal(
    stack: Stack, make_topic: MakeTopic, caplog: pytest.LogCaptureFixture
) -> None:
    small = small_topic(stack, f"small-{uuid.uuid4().hex[:10]}")
    fine = make_topic(partitions=1)
    config = Settings(bootstrap_servers=stack.bootstrap_servers, kafka_overrides=GAPLESS)
    publisher = dead_letter_publisher(config)
    try:
        # When the broker refuses a record and the producer goes fatal over it
        with (
            caplog.at_level(logging.ERROR, logger="kinbox.kafka.publisher"),
            pytest.raises(TransportError) as failed,
        ):
            deliver(publisher, [OutgoingRecord(small, None, b"x" * (3 * LIMIT), [])])
        # Then the delivery fails as something to retry, and the producer is new
        assert failed.value.retriable, failed.value
        assert "dead-letter producer failed fatally" in caplog.text and "GAPLESS" in caplog.text
        assert publisher.replaced == 1
        # And the new producer publishes (the old one refuses everything with _FATAL)
        deliver(publisher, [OutgoingRecord(fine, b"k", b"after", [("event-id", b"e1")])])
    finally:
        publisher.close()
    [record] = list(read_topic(config, fine, timeout=5))
    assert record.value == b"after"


def test_worker_rolls_back_a_dead_letter_lost_to_a_fatal_producer_and_delivers_it_later(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a dead-letter topic that refuses the poison event's dead letter
    topic = make_topic(partitions=1)
    small_topic(stack, f"{topic}.dlq")
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)

    app = poison_app(topic, schema, group, max_attempts=1)
    config = settings(
        stack.bootstrap_servers, stack.database_url, group, schema, kafka_overrides=GAPLESS
    )
    _produce(stack, topic, [("e1", b"{}"), ("poison", b"x" * (3 * LIMIT)), ("e2", b"{}")])

    with (
        caplog.at_level(logging.ERROR, logger="kinbox.kafka.publisher"),
        running(app, config),
    ):
        # When each try's dead letter makes the producer fatal
        wait_for(
            lambda: caplog.text.count("dead-letter producer failed fatally") >= 2,
            what="two tries lost to a fatal producer",
        )
        # Then the partition holds at the poison record: the event before it
        # is committed, nothing after it, and no dead letter is recorded
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 1})
        assert [row[1] for row in effects(db, schema)] == ["e1"]
        assert "poison" not in statuses(db, schema, group)
        # When the topic takes the dead letter, the next try (on a new producer) delivers it
        raise_limit(stack, f"{topic}.dlq")
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 3})

    assert [row[1] for row in effects(db, schema)] == ["e1", "e2"]
    assert statuses(db, schema, group)["poison"][0] == "dead_lettered"
    [letter] = read_topic(config, f"{topic}.dlq", timeout=5)
    assert header(letter, "event-id") == "poison"


def _produce(stack: Stack, topic: str, events: list[tuple[str, bytes]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": stack.bootstrap_servers})
    for event_id, value in events:
        producer.produce(topic, value=value, partition=0, headers=[("event-id", event_id)])
    assert producer.flush(30) == 0


@contextmanager
def relaying(relay: Relay) -> Iterator[None]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            relay.run()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield
    finally:
        relay.stop()
        thread.join(60)
    assert not thread.is_alive() and not errors, errors


def _rows(db: Conn, schema: str) -> list[tuple[Any, ...]]:
    """``(key, status, attempts, last_error)`` of every outbox row."""
    query = sql.SQL("SELECT aggregateid, status, attempts, last_error FROM {}.outbox")
    return db.execute(query.format(sql.Identifier(schema))).fetchall()


def test_relay_replaces_a_fatal_producer_and_parks_no_good_row(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # Given one row too large for its topic, and good rows on another topic,
    # all in one lane (so in the big row's batches), and few tries before parking
    small = small_topic(stack, f"small-{uuid.uuid4().hex[:10]}")
    fine = make_topic(partitions=3)
    migrate_outbox(db, schema)
    with psycopg.connect(stack.database_url) as conn:
        with conn.transaction():
            enqueue(conn, small, {"blob": "x" * (3 * LIMIT)}, key="big", schema=schema)
        for n in range(30):
            with conn.transaction():
                enqueue(conn, fine, {"n": n}, key=f"k{n % 5}", schema=schema)
    publisher = relay_publisher(producer_config(stack.bootstrap_servers, GAPLESS))
    config = relay_config(
        stack, schema, lanes=1, max_attempts=2, backoff_base=0.05, backoff_max=0.2
    )
    relay = Relay(config, publisher)

    # When the relay publishes them with an idempotent producer that goes fatal
    with relaying(relay):

        def settled() -> bool:
            rows = _rows(db, schema)
            big = [r[1] for r in rows if r[0] == "big"]
            return big == ["dead"] and all(r[1] == "sent" for r in rows if r[0] != "big")

        wait_for(settled, timeout=60, what="the big row parked and every good row sent")
    publisher.close()

    # Then the big row was parked for its own error, no good row was, and the
    # producer was replaced each time the big row broke it
    rows = _rows(db, schema)
    [big] = [r for r in rows if r[0] == "big"]
    assert "MSG_SIZE_TOO_LARGE" in big[3], big
    assert publisher.replaced >= 1
    assert [r[1] for r in rows].count("dead") == 1
    received = consume(stack, fine, 30)
    assert len({r.event_id for r in received}) == 30
