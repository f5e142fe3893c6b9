"""A dead letter the broker will not take holds only its partition, loudly, until it can.

The realistic way to get there after the start-up check passed: an operator
lowers the dead-letter topic's ``max.message.bytes`` below what a dead letter
needs while the worker runs. A real worker (in a thread, so the test can read
its OpenTelemetry counters through an in-memory SDK reader) against the real
broker: the poison event's partition holds exactly at it (read back from the
broker), the other partition drains, every try says so at ERROR with the
dead-letter topic and the broker's reason and is counted; once the limit is
raised again the dead letter goes out and the partition drains.
"""

from __future__ import annotations

import logging
import uuid

import pytest

from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.integration.failure_support import poison_app, running, statuses
from tests.integration.inbox_support import committed, effects, settings
from tests.support import metrics
from tests.support.database import Conn, prepare_schema
from tests.support.records import Headers, produce_plan, read_topic, set_max_message_bytes
from tests.support.topics import create_topic
from tests.support.waiting import wait_for

TOO_SMALL = 200
"""A ``max.message.bytes`` no dead letter fits: its ``kinbox.dlq.*`` headers alone are larger."""
KAFKA_DEFAULT = 1_048_588
UNDELIVERED = "not delivered"


def test_an_undeliverable_dead_letter_holds_only_its_partition_until_the_topic_takes_it(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    metrics.install()
    bootstrap = stack.bootstrap_servers
    topic = make_topic(partitions=2)
    dlq = f"{topic}.dlq"
    create_topic(bootstrap, dlq, 2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)

    app = poison_app(topic, schema, group, max_attempts=1)
    config = settings(bootstrap, stack.database_url, group, schema)

    def plan(items: list[tuple[int, str]]) -> None:
        rows: list[tuple[int, Headers, str | None]] = [
            (partition, [("event-id", event_id.encode())], event_id)
            for partition, event_id in items
        ]
        produce_plan(bootstrap, topic, 2, rows)

    with caplog.at_level(logging.ERROR, logger="kinbox.consume.backoff"), running(app, config):
        # Given a worker that started while the dead-letter topic took any record
        plan([(1, "warm-up")])
        wait_for(lambda: committed(bootstrap, group, topic, 2) == {1: 1}, what="the warm-up")
        # When the topic's limit is lowered below any dead letter, after the start
        set_max_message_bytes(bootstrap, dlq, TOO_SMALL)
        # ... and a poison event arrives between good ones on partition 0,
        # with good ones on partition 1
        plan([(0, "a1"), (0, "poison"), (0, "a2")] + [(1, f"b{n}") for n in range(5)])
        wait_for(
            lambda: caplog.text.count(UNDELIVERED) >= 3,
            what="three tries of the dead letter refused",
        )
        # Then only partition 0 waits, exactly at the poison record (offset 1):
        # the event before it is applied, the one after it not yet; partition 1 drained
        wait_for(lambda: committed(bootstrap, group, topic, 2) == {0: 1, 1: 6})
        tries = caplog.text.count(UNDELIVERED)
        wait_for(lambda: caplog.text.count(UNDELIVERED) > tries, what="one more try")
        assert committed(bootstrap, group, topic, 2) == {0: 1, 1: 6}
        applied = {row[1] for row in effects(db, schema)}
        assert applied == {"warm-up", "a1", "b0", "b1", "b2", "b3", "b4"}
        assert "poison" not in statuses(db, schema, group)
        # ... every try said so at ERROR, naming the topic and the broker's reason
        lines = [r for r in caplog.records if UNDELIVERED in r.getMessage()]
        assert all(r.levelno == logging.ERROR for r in lines)
        assert all(repr(dlq) in r.getMessage() for r in lines), lines[0].getMessage()
        assert all("MSG_SIZE_TOO_LARGE" in r.getMessage() for r in lines), lines[0].getMessage()
        assert all(f"{topic}[0]@1" in r.getMessage() for r in lines)
        # ... and counted each time, under the dead-letter topic
        counted = metrics.counted(
            "kinbox.dead_letters.undeliverable", topic=dlq, source_topic=topic
        )
        assert counted >= len(lines) >= 3, (counted, len(lines))
        # When the operator raises the limit again
        set_max_message_bytes(bootstrap, dlq, KAFKA_DEFAULT)
        # Then the dead letter goes out and the partition drains
        wait_for(lambda: committed(bootstrap, group, topic, 2) == {0: 3, 1: 6})

    assert statuses(db, schema, group)["poison"][0] == "dead_lettered"
    assert {row[1] for row in effects(db, schema)} == applied | {"a2"}
    assert len(effects(db, schema)) == len(applied) + 1  # each applied once
    letters = [r for r in read_topic(bootstrap, dlq) if r.header("kinbox.dlq.topic") == topic]
    assert [r.header("event-id") for r in letters] == ["poison"]
    assert [r.header("kinbox.dlq.offset") for r in letters] == ["1"]
    assert metrics.counted("kinbox.events.dead_lettered", topic=topic) == 1
