"""Parked keys end to end: a real worker parks a key behind its dead letter, the CLI lets it go.

A real ``kinbox worker`` (:mod:`tests.support.parking_app`, in partition
order and in key order) dead-letters a held event; the later events of its
key are parked, other keys go on. ``kinbox dlq parked`` lists the key;
``kinbox dlq replay`` of the dead letter (the fix deployed) re-publishes it
and then the parked events, and the worker applies them in their key's
order, each once; the key is then free. ``kinbox dlq discard`` gives a
key's parked events up instead.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from psycopg import sql

from kinbox.cli.main import main
from kinbox.devstack.stack import Stack
from tests.support.database import prepare_schema
from tests.support.parking_app import EFFECTS_DDL
from tests.support.topics import create_topic
from tests.support.waiting import wait_for
from tests.support.workers import Worker, WorkerFactory, workers

APP = "tests.support.parking_app:app"


@pytest.fixture
def factory(stack: Stack, tmp_path: Path) -> Iterator[WorkerFactory]:
    schema = f"park_{uuid.uuid4().hex[:10]}"
    topic = f"park-{uuid.uuid4().hex[:10]}"
    create_topic(stack.bootstrap_servers, topic, 2)
    prepare_schema(stack.database_url, schema)
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL(EFFECTS_DDL).format(sql.Identifier(schema)))
    with workers(
        stack.bootstrap_servers, stack.database_url, f"g-{schema}", schema, topic, tmp_path
    ) as made:
        made.app = APP
        yield made


def send(factory: WorkerFactory, key: str, *events: tuple[str, bool]) -> None:
    """Produce ``(event id, held)`` events of ``key``, in order, all acknowledged."""
    producer = Producer({"bootstrap.servers": factory.bootstrap, "enable.idempotence": True})
    for event_id, held in events:
        producer.produce(
            factory.topic, json.dumps({"hold": held}).encode(), key=key.encode(),
            headers=[("event-id", event_id.encode())],
        )  # fmt: skip
    assert producer.flush(30) == 0


def query(factory: WorkerFactory, text: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(factory.database_url, autocommit=True) as conn:
        formatted = sql.SQL(text).format(schema=sql.Identifier(factory.schema))
        return conn.execute(formatted, params).fetchall()


def applied(factory: WorkerFactory, key: str) -> list[str]:
    rows = query(
        factory, "SELECT event_id FROM {schema}.park_effects WHERE key = %s ORDER BY seq", key
    )
    return [r[0] for r in rows]


def cli(factory: WorkerFactory, *args: str) -> str:
    connection = [
        "--bootstrap-servers", factory.bootstrap, "--database-url", factory.database_url,
        "--schema", factory.schema,
    ]  # fmt: skip
    result = CliRunner().invoke(main, ["dlq", *args, *connection])
    assert result.exit_code == 0, result.output
    return result.output


def start(factory: WorkerFactory, hold: Path, ordering: str) -> Worker:
    env = {"PARK_HOLD": str(hold), "PARK_ORDERING": ordering}
    return factory.start("worker", env=env, batch_max_messages=20)


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_replaying_the_dead_letter_applies_its_parked_key_in_order(
    factory: WorkerFactory, tmp_path: Path, ordering: str
) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    worker = start(factory, hold, ordering)
    # Given a held event of key k, two more of k behind it, and another key's events
    send(factory, "k", ("k0", True), ("k1", False), ("k2", False))
    send(factory, "j", ("j0", False), ("j1", False))
    wait_for(lambda: applied(factory, "j") == ["j0", "j1"], 60, "key j applied")
    wait_for(
        lambda: query(factory, "SELECT count(*) FROM {schema}.parked_events") == [(2,)],
        60, "k1 and k2 parked",
    )  # fmt: skip
    # And a later event of k, parked too
    send(factory, "k", ("k3", False))
    wait_for(
        lambda: query(factory, "SELECT count(*) FROM {schema}.parked_events") == [(3,)],
        60, "k3 parked",
    )  # fmt: skip
    assert applied(factory, "k") == []
    listed = cli(factory, "parked")
    assert "key=k waiting=3 behind=k0" in listed and "1 parked key(s)" in listed
    # When the fix is deployed and the dead letter replayed
    hold.unlink()
    replayed = cli(factory, "replay", "--topic", f"{factory.topic}.dlq")
    assert "replayed 1 of 1 read" in replayed and "released 3 parked event(s)" in replayed
    # Then k's events are applied in their order, each once, and k is free again
    wait_for(lambda: applied(factory, "k") == ["k0", "k1", "k2", "k3"], 60, "key k applied")
    send(factory, "k", ("k4", False))
    wait_for(lambda: applied(factory, "k")[-1:] == ["k4"], 60, "k4 applied at once")
    assert applied(factory, "k") == ["k0", "k1", "k2", "k3", "k4"]
    assert query(factory, "SELECT count(*) FROM {schema}.parked_keys") == [(0,)]
    assert "0 parked key(s)" in cli(factory, "parked", "--idle")
    assert worker.stop() == 0, worker.log_tail()


def test_discarding_a_parked_key_gives_its_events_up_and_frees_it(
    factory: WorkerFactory, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    worker = start(factory, hold, "partition")
    send(factory, "k", ("k0", True), ("k1", False))
    wait_for(
        lambda: query(factory, "SELECT count(*) FROM {schema}.parked_events") == [(1,)],
        60, "k1 parked",
    )  # fmt: skip
    group = f"g-{factory.schema}"
    out = cli(factory, "discard", "--group", group, "--topic", factory.topic, "--key", "k")
    assert "discarded 1 parked event(s)" in out
    status = dict(query(factory, "SELECT event_id, status FROM {schema}.processed_events"))
    assert status == {"k0": "dead_lettered", "k1": "skipped"}
    # The key is free: its next event is applied
    send(factory, "k", ("k2", False))
    wait_for(lambda: applied(factory, "k") == ["k2"], 60, "k2 applied")
    # A key that is not parked is refused with a clear error
    result = CliRunner().invoke(
        main,
        ["dlq", "release", "--group", group, "--topic", factory.topic, "--key", "k",
         "--database-url", factory.database_url, "--schema", factory.schema,
         "--bootstrap-servers", factory.bootstrap],
    )  # fmt: skip
    assert result.exit_code != 0 and "is not parked" in result.output
    assert worker.stop() == 0, worker.log_tail()
