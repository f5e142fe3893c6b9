"""The inbox against a real Kafka broker and PostgreSQL: duplicates, groups, offsets."""

from __future__ import annotations

import uuid

import pytest

from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.integration.inbox_support import (
    app_for,
    assert_offsets_not_ahead,
    committed,
    effects,
    produce,
    running,
    settings,
)
from tests.integration.refusal_support import dead_letters, run_to_end, with_id, write
from tests.support.database import Conn, prepare_schema
from tests.support.waiting import wait_for


def test_same_event_delivered_three_times_has_one_effect(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # Given the same event (same id header) published three times, at three offsets
    topic = make_topic(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    produced = produce(stack.bootstrap_servers, topic, [("evt-1", 0), ("evt-2", 0)])
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    with running(app_for(topic, schema, group), config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 2})
        # including one redelivery arriving in a later batch
        produce(stack.bootstrap_servers, topic, [("evt-1", 0), ("evt-1", 0)], produced)
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 4})
    # Then the effect happened once, and the committed offset covers all four records
    assert sorted(row[1] for row in effects(db, schema)) == ["evt-1", "evt-2"]
    assert_offsets_not_ahead(db, schema, stack.bootstrap_servers, group, topic, 1, produced)


def test_two_consumer_groups_on_one_database_each_apply_once(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    topic = make_topic(partitions=3)
    prepare_schema(stack.database_url, schema)
    ids = [f"e{i}" for i in range(60)]
    produced = produce(stack.bootstrap_servers, topic, [(i, n % 3) for n, i in enumerate(ids)])
    groups = [f"billing-{uuid.uuid4().hex[:6]}", f"audit-{uuid.uuid4().hex[:6]}"]
    configs = [settings(stack.bootstrap_servers, stack.database_url, g, schema) for g in groups]
    with (
        running(app_for(topic, schema, groups[0]), configs[0]),
        running(app_for(topic, schema, groups[1]), configs[1]),
    ):
        for group in groups:

            def done(g: str = group) -> bool:
                return sum(committed(stack.bootstrap_servers, g, topic, 3).values()) == len(ids)

            wait_for(done, what=f"group {group} to commit every offset")
    for group in groups:
        applied = [row[1] for row in effects(db, schema, group)]
        assert sorted(applied) == sorted(ids), group
        assert_offsets_not_ahead(db, schema, stack.bootstrap_servers, group, topic, 3, produced)


@pytest.mark.parametrize("batch_max_messages", [1, 500])
def test_committed_offsets_never_run_ahead_of_the_database(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn, batch_max_messages: int
) -> None:
    # Sampled while the worker runs, not only at the end.
    topic = make_topic(partitions=3)
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    produced = produce(stack.bootstrap_servers, topic, [(f"e{i}", i % 3) for i in range(300)])
    config = settings(
        stack.bootstrap_servers, stack.database_url, group, schema,
        batch_max_messages=batch_max_messages,
    )  # fmt: skip
    with running(app_for(topic, schema, group), config):

        def check_done() -> bool:
            offsets = assert_offsets_not_ahead(
                db, schema, stack.bootstrap_servers, group, topic, 3, produced
            )
            return sum(offsets.values()) == len(produced)

        wait_for(check_done, what="every offset committed")
    assert len(effects(db, schema)) == len(produced)


def test_failing_handler_is_retried_from_the_failed_offset_without_skipping(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # Given a handler that fails twice on one event, on a real consumer (pause + seek + resume)
    from typing import Any

    from kinbox import App, Event

    topic = make_topic(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    produced = produce(stack.bootstrap_servers, topic, [(f"e{i}", 0) for i in range(10)])
    inner = app_for(topic, schema, group).routes[topic].fn
    app = App(group_id=group)
    attempts: list[tuple[str, int]] = []

    @app.handler(topic)
    def flaky(event: Event, tx: Any) -> None:
        attempts.append((event.id, event.attempt))
        if event.id == "e4" and event.attempt < 3:
            raise RuntimeError("temporarily broken")
        inner(event, tx)

    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    with running(app, config):
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 10})
    # Then each event applied once, in order, after the retries
    assert [row[1] for row in effects(db, schema)] == [f"e{i}" for i in range(10)]
    assert ("e4", 3) in attempts
    assert_offsets_not_ahead(db, schema, stack.bootstrap_servers, group, topic, 1, produced)


def test_a_header_named_id_is_not_an_event_id_unless_configured(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    # Given two distinct events of one entity, whose producer puts the entity's
    # id in a header named `id`, and a record that has only an `id` header
    topic = make_topic(partitions=1)
    prepare_schema(stack.database_url, schema)
    entity = (b"id", b"order-7")
    records = [(with_id("e1", entity), b"{}"), (with_id("e2", entity), b"{}")]
    records.append(([(b"id", b"router-1")], b"{}"))
    written = write(stack.bootstrap_servers, topic, records)
    # When a group reads them with the default id headers (event-id, ce_id)
    group = f"g-{uuid.uuid4().hex[:8]}"
    config = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    assert config.id_headers == ("event-id", "ce_id")
    assert run_to_end(app_for(topic, schema, group), config, written) == {0: 3}
    # Then both events are applied (not merged on `id`), and the id-only record
    # has no event id: dead-lettered, keyed on its position
    assert [row[1] for row in effects(db, schema, group)] == ["e1", "e2"]
    [letter] = dead_letters(stack.bootstrap_servers, topic)
    assert letter.header("kinbox.dlq.reason") == "invalid-id"
    # When another group turns `id` on, as with Debezium's outbox router
    router = f"g-{uuid.uuid4().hex[:8]}"
    config = settings(
        stack.bootstrap_servers, stack.database_url, router, schema,
        id_headers=("event-id", "ce_id", "id"),
    )  # fmt: skip
    assert run_to_end(app_for(topic, schema, router), config, written) == {0: 3}
    # Then the id-only record is applied under its `id`; event-id still comes first
    assert [row[1] for row in effects(db, schema, router)] == ["e1", "e2", "router-1"]
