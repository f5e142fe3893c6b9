"""Dead letters against the real broker and database: poison event -> DLQ -> fix -> replay."""

from __future__ import annotations

import uuid

from click.testing import CliRunner
from confluent_kafka import Producer

from kinbox.cli.main import main
from kinbox.core.event import Event
from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.integration.failure_support import (
    dead_letters,
    effect_app,
    header,
    running,
    statuses,
)
from tests.integration.inbox_support import (
    assert_offsets_not_ahead,
    committed,
    effects,
    produce,
    settings,
)
from tests.support.database import Conn, prepare_schema
from tests.support.waiting import wait_for


def _produce_without_id(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value=b'{"n": 1}', partition=0, headers=[("event-id", b"")])
    assert producer.flush(30) == 0


def test_poison_event_is_dead_lettered_then_replayed_and_applied_once(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # Given a handler that cannot handle "poison", and a record with an empty id
    topic = make_topic(partitions=1)
    dlq = f"{topic}.dlq"
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    broken = [True]

    def before(event: Event) -> None:
        if broken[0] and event.id == "poison":
            raise ValueError("cannot parse amount")

    app = effect_app(topic, schema, group, before, max_attempts=2)
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    produced = produce(stack.bootstrap_servers, topic, [("e1", 0), ("poison", 0), ("e2", 0)])
    _produce_without_id(stack.bootstrap_servers, topic)

    # When a worker consumes them
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 4})

    # Then the good events are applied, the bad ones are in the DLQ and recorded as such
    assert [row[1] for row in effects(db, schema)] == ["e1", "e2"]
    status = statuses(db, schema, group)
    assert status["poison"][0] == "dead_lettered"
    assert status["poison"][1] == "handler-error: ValueError: cannot parse amount"
    assert status[f"{topic}/0/3"][0] == "dead_lettered"
    assert (status[f"{topic}/0/3"][1] or "").startswith("invalid-id: EnvelopeError")
    # (the DLQ topic has 3 partitions and the records no key: order by original offset)
    letters = sorted(
        dead_letters(config, dlq), key=lambda r: int(header(r, "kinbox.dlq.offset") or 0)
    )
    assert [header(r, "kinbox.dlq.reason") for r in letters] == ["handler-error", "invalid-id"]
    poison = letters[0]
    assert header(poison, "event-id") == "poison" and poison.value == b'{"n": 1}'
    assert header(poison, "kinbox.dlq.topic") == topic
    assert (header(poison, "kinbox.dlq.offset"), header(poison, "kinbox.dlq.attempts")) == (
        "1",
        "2",
    )
    assert header(poison, "kinbox.dlq.consumer") == group
    assert_offsets_not_ahead(db, schema, stack.bootstrap_servers, group, topic, 1, produced)

    # When the handler is fixed and the dead letters are replayed (a dry run first, then twice)
    broken[0] = False
    cli = CliRunner()
    args = ["dlq", "replay", "--topic", dlq, "--bootstrap-servers", stack.bootstrap_servers]
    dry = cli.invoke(main, [*args, "--filter-reason", "handler", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "would replay 1 of 2 read; 1 skipped" in dry.output
    for _ in range(2):
        done = cli.invoke(main, [*args, "--filter-reason", "handler", "--limit", "5"])
        assert done.exit_code == 0, done.output
        assert "replayed 1 of 2 read" in done.output
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 6})

    # Then the poison event is applied exactly once, with its original id
    assert sorted(row[1] for row in effects(db, schema)) == ["e1", "e2", "poison"]
    assert statuses(db, schema, group)["poison"] == ("applied", None)
    assert len(dead_letters(config, dlq)) == 2  # nothing dead-lettered again


def test_dead_letter_requested_by_the_handler_and_a_second_group_unaffected(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    from kinbox.core.errors import DeadLetter

    topic = make_topic(partitions=1)
    prepare_schema(stack.database_url, schema)
    target = f"{topic}-poison"
    groups = [f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"]

    def refuse(event: Event) -> None:
        raise DeadLetter("customer unknown")

    produce(stack.bootstrap_servers, topic, [("x1", 0)])
    # Group a gives the event up into its own topic; group b applies it
    app_a = effect_app(topic, schema, groups[0], refuse, dead_letter_topic=target)
    app_b = effect_app(topic, schema, groups[1])
    for app, group in ((app_a, groups[0]), (app_b, groups[1])):
        config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
        with running(app, config):
            done = {0: 1}
            wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == done)  # noqa: B023
    assert [r[0] for r in effects(db, schema)] == [groups[1]]
    [letter] = dead_letters(config, target)
    assert header(letter, "kinbox.dlq.reason") == "dead-letter-requested: customer unknown"
    assert statuses(db, schema, groups[0])["x1"][0] == "dead_lettered"
    assert statuses(db, schema, groups[1])["x1"] == ("applied", None)
