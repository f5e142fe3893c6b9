"""Database outages and slow handlers under a real in-process worker (real broker, real PostgreSQL).

The outage tests restart and disturb a PostgreSQL server of their own, never
the session's.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections import Counter

import psycopg
import pytest
from confluent_kafka import Consumer

from kinbox.core.event import Event
from kinbox.devstack.postgres import PostgresServer
from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.integration.failure_support import effect_app, running
from tests.integration.inbox_support import assert_offsets_not_ahead, committed, produce, settings
from tests.support.database import prepare_schema, terminate_open_transactions
from tests.support.waiting import wait_for

N = 120


@pytest.fixture(scope="module")
def postgres(own_postgres: PostgresServer) -> PostgresServer:
    """A PostgreSQL server these tests may restart and disturb (not the shared one)."""
    return own_postgres


def _count(url: str, schema: str) -> Counter[str]:
    for _ in range(100):
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
                rows = conn.execute(f"SELECT event_id FROM {schema}.effects").fetchall()
            return Counter(r[0] for r in rows)
        except psycopg.OperationalError:
            time.sleep(0.2)  # the server is restarting
    raise AssertionError("database did not come back")


@pytest.mark.parametrize("fault", ["restart-immediate", "terminate-backend"])
def test_database_outage_mid_stream_applies_every_event_once(
    stack: Stack, make_topic: MakeTopic, postgres: PostgresServer, fault: str
) -> None:
    # Given a worker applying events slowly enough for the fault to land mid-batch
    # (20 ms an event: its two partitions are applied side by side)
    topic = make_topic(partitions=2)
    schema = f"kb_{uuid.uuid4().hex[:12]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(postgres.url, schema)
    produced = produce(stack.bootstrap_servers, topic, [(f"e{i}", i % 2) for i in range(N)])
    app = effect_app(topic, schema, group, lambda _e: time.sleep(0.02), max_attempts=1)
    config = settings(stack.bootstrap_servers, postgres.url, group, schema, batch_max_messages=20)
    ends = {p: sum(1 for (q, _o) in produced if q == p) for p in (0, 1)}

    with running(app, config):
        wait_for(lambda: sum(_count(postgres.url, schema).values()) >= 20)
        # When the database goes away under it
        if fault == "restart-immediate":
            postgres.restart(immediate=True)
        else:
            terminated = 0
            deadline = time.monotonic() + 20
            while terminated < 3 and time.monotonic() < deadline:
                terminated += terminate_open_transactions(postgres.url)
                time.sleep(0.05)
            assert terminated >= 1
        # Then the worker rides it out and catches up by itself
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 2) == ends, timeout=90)

    counts = _count(postgres.url, schema)
    assert set(counts) == {f"e{i}" for i in range(N)}
    assert max(counts.values()) == 1, [k for k, v in counts.items() if v > 1]
    with psycopg.connect(postgres.url, autocommit=True) as db:
        assert_offsets_not_ahead(db, schema, stack.bootstrap_servers, group, topic, 2, produced)
        # An outage is never a reason to dead-letter (max_attempts=1 would have)
        dead = db.execute(
            f"SELECT count(*) FROM {schema}.processed_events WHERE status <> 'applied'"
        ).fetchone()
        assert dead == (0,)


def test_handler_slower_than_max_poll_interval_stays_in_the_group(
    stack: Stack,
    make_topic: MakeTopic,
    schema: str,
    db: psycopg.Connection[tuple[object, ...]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given max.poll.interval.ms = 6 s and a handler that takes 9 s for one event
    caplog.set_level(logging.INFO, logger="kinbox")
    topic = make_topic(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    calls: Counter[str] = Counter()

    def slow(event: Event) -> None:
        calls[event.id] += 1
        if event.id == "slow":
            time.sleep(9)

    produced = produce(stack.bootstrap_servers, topic, [("a", 0), ("slow", 0), ("b", 0)])
    app = effect_app(topic, schema, group, slow)
    base = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    config = dataclasses.replace(base, max_poll_interval=6, batch_max_messages=2).validate()
    with running(app, config) as runner:
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 3}, 40)
        assert runner._flow.assigned == {(topic, 0)}
    # The member was never expelled: no partition lost or revoked before the shutdown
    loop = {"kinbox.consume.runner", "kinbox.consume.inflight"}
    messages = [r.getMessage() for r in caplog.records if r.name in loop]
    assert any("still running after" in m for m in messages)
    shutdown = next(i for i, m in enumerate(messages) if m.startswith("revoked"))
    assert not any(m.startswith("lost") for m in messages)
    assert all("still running" in m or "assigned" in m or "consuming" in m
               for m in messages[:shutdown]), messages  # fmt: skip
    # Then every handler ran once (no redelivery, no zombie), each effect once
    assert calls == Counter({"a": 1, "slow": 1, "b": 1})
    rows = db.execute(f"SELECT event_id FROM {schema}.effects ORDER BY seq").fetchall()
    assert [r[0] for r in rows] == ["a", "slow", "b"]
    assert_offsets_not_ahead(db, schema, stack.bootstrap_servers, group, topic, 1, produced)


def test_a_revoke_waits_half_the_consumers_own_max_poll_interval(
    stack: Stack,
    make_topic: MakeTopic,
    schema: str,
    db: psycopg.Connection[tuple[object, ...]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Given -X max.poll.interval.ms=8000 over the max_poll_interval setting of
    # 30 s (and a shutdown timeout of 30 s): the consumer's value is 8 s, so a
    # revoke waits 4 s for a batch in flight (15 s with the setting's value)
    caplog.set_level(logging.INFO, logger="kinbox")
    topic = make_topic(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    release = threading.Event()

    def held(event: Event) -> None:
        if event.id == "slow":
            release.wait(30)

    produce(stack.bootstrap_servers, topic, [("slow", 0), ("b", 0)])
    eager = {"partition.assignment.strategy": "range"}  # a join revokes every partition
    base = settings(stack.bootstrap_servers, stack.database_url, group, schema)
    config = dataclasses.replace(
        base, shutdown_timeout=30, kafka_overrides={**base.kafka_overrides, **eager,
        "max.poll.interval.ms": "8000"},
    ).validate()  # fmt: skip
    assert config.max_poll_interval == 30
    leave = threading.Event()
    with running(effect_app(topic, schema, group, held), config):
        wait_for(lambda: "still running after" in caplog.text, 30, "the batch in flight")
        # When a second member joins while the batch runs (its partition is revoked)
        member = threading.Thread(
            target=_member, args=(stack.bootstrap_servers, group, topic, eager, leave)
        )
        member.start()
        try:
            wait_for(lambda: "its offsets will not be committed" in caplog.text, 30, "the revoke")
        finally:
            release.set()
            leave.set()
            member.join(30)
        # Then the revoke waited 4 s, not 15 s, while the handler still ran
        [gave_up] = [
            r.getMessage() for r in caplog.records if "will not be committed" in r.getMessage()
        ]
        assert "still running after 4.0s" in gave_up, gave_up
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 2}, 60)
    rows = db.execute(f"SELECT event_id FROM {schema}.effects ORDER BY seq").fetchall()
    assert sorted(str(r[0]) for r in rows) == ["b", "slow"]


def _member(
    bootstrap: str, group: str, topic: str, config: dict[str, str], leave: threading.Event
) -> None:
    """A plain consumer of ``group`` that joins, polls (commits nothing) until ``leave``."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "log_level": 3, **config}
    )  # fmt: skip
    consumer.subscribe([topic])
    try:
        while not leave.is_set():
            consumer.poll(0.2)
    finally:
        consumer.close()


def test_inbox_cleanup_deletes_old_rows_in_batches(
    stack: Stack, schema: str, db: psycopg.Connection[tuple[object, ...]]
) -> None:
    from click.testing import CliRunner

    from kinbox.cli.main import main

    prepare_schema(stack.database_url, schema)
    db.execute(
        f'INSERT INTO {schema}.processed_events (consumer, event_id, topic, partition, "offset",'
        " processed_at) SELECT 'g', 'old' || n, 't', 0, n, now() - interval '20 days'"
        " FROM generate_series(1, 25) n"
    )
    db.execute(
        f'INSERT INTO {schema}.processed_events (consumer, event_id, topic, partition, "offset")'
        " VALUES ('g', 'new', 't', 0, 99)"
    )
    # Group g is unknown to Kafka, so its dedup window is too: only --force deletes
    args = ["inbox", "cleanup", "--older-than", "14d", "--batch-size", "10", "--force"]
    result = CliRunner().invoke(
        main,
        [*args, "--database-url", stack.database_url, "--schema", schema,
         "--bootstrap-servers", stack.bootstrap_servers],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "FORCED" in result.output
    assert "deleted 25 processed_events row(s) older than 14d" in result.output
    left = db.execute(f"SELECT event_id FROM {schema}.processed_events").fetchall()
    assert left == [("new",)]
