"""Helpers for the inbox integration tests: schema, producing, workers, invariant checks."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Producer
from psycopg import sql

from kinbox.app import App
from kinbox.config import Settings
from kinbox.consume.runner import Runner
from kinbox.kafka import KafkaPublisher, KafkaTransport
from kinbox.store.postgres import PostgresInboxStore, apply_migrations
from kinbox.store.schema import INBOX
from tests.integration.inbox_app import make_app
from tests.support.workers import committed as committed  # re-exported for the inbox tests

ROOT = Path(__file__).resolve().parents[2]
Conn = psycopg.Connection[tuple[Any, ...]]
Produced = dict[tuple[int, int], str]
"""(partition, offset) -> event id, from the producer's delivery reports."""

FAST_GROUP = {"heartbeat.interval.ms": "500", "topic.metadata.refresh.interval.ms": "2000"}


def prepare_schema(database_url: str, schema: str) -> None:
    apply_migrations(database_url, schema, [INBOX])
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.effects (seq bigserial PRIMARY KEY, consumer text, event_id text,"
                ' topic text, partition int, "offset" bigint, pid int)'
            ).format(sql.Identifier(schema))
        )


def produce(
    bootstrap: str, topic: str, events: Sequence[tuple[str, int]], produced: Produced | None = None
) -> Produced:
    """Send ``(event_id, partition)`` pairs with an ``event-id`` header; return their offsets."""
    out: Produced = {} if produced is None else produced
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})

    failures: list[Any] = []

    def delivered(event_id: str, err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(err)
        else:
            out[(msg.partition(), msg.offset())] = event_id

    for event_id, partition in events:
        producer.produce(
            topic,
            value=b'{"n": 1}',
            partition=partition,
            headers=[("event-id", event_id.encode())],
            on_delivery=functools.partial(delivered, event_id),
        )
        producer.poll(0)
    assert producer.flush(30) == 0
    assert not failures, failures
    return out


def effects(db: Conn, schema: str, consumer: str | None = None) -> list[tuple[Any, ...]]:
    query = sql.SQL(
        'SELECT consumer, event_id, partition, "offset", pid FROM {}.effects ORDER BY seq'
    ).format(sql.Identifier(schema))
    rows = db.execute(query).fetchall()
    return [r for r in rows if consumer is None or r[0] == consumer]


def processed_ids(db: Conn, schema: str, consumer: str) -> set[str]:
    query = sql.SQL("SELECT event_id FROM {}.processed_events WHERE consumer = %s").format(
        sql.Identifier(schema)
    )
    return {r[0] for r in db.execute(query, (consumer,)).fetchall()}


def assert_offsets_not_ahead(
    db: Conn, schema: str, bootstrap: str, group: str, topic: str, partitions: int,
    produced: Produced,
) -> dict[int, int]:  # fmt: skip
    """Invariant 2: every record below a committed offset has its id recorded in the DB."""
    offsets = committed(bootstrap, group, topic, partitions)
    done = processed_ids(db, schema, group)
    for (partition, offset), event_id in produced.items():
        if offset < offsets.get(partition, 0):
            assert event_id in done, (
                f"offset {offsets[partition]} committed for partition {partition} "
                f"but event {event_id!r} at offset {offset} is not in the database"
            )
    return offsets


def wait_for(condition: Callable[[], bool], timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")


def settings(bootstrap: str, database_url: str, group: str, schema: str, **kw: Any) -> Settings:
    overrides = {**FAST_GROUP, **kw.pop("kafka_overrides", {})}
    return Settings(
        bootstrap_servers=bootstrap, database_url=database_url, group_id=group, schema=schema,
        session_timeout=6, max_poll_interval=30, retry_initial=0.1, retry_max=1,
        kafka_overrides=overrides, **kw,
    ).validate()  # fmt: skip


@contextmanager
def running(app: App, config: Settings, *, dead_letters: bool = False) -> Iterator[Runner]:
    """Run a real group member (real Kafka, real PostgreSQL) in a thread.

    ``dead_letters`` gives it a real dead-letter publisher, as ``kinbox worker`` has.
    """
    store = PostgresInboxStore(config.database_url, schema=config.schema, consumer=config.group_id)
    store.open()
    publisher = KafkaPublisher(config) if dead_letters else None
    runner = Runner(app, config, KafkaTransport(config), store, publisher=publisher)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            runner.run()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target, name=f"runner-{config.group_id}", daemon=True)
    thread.start()
    try:
        yield runner
    finally:
        runner.stop()
        thread.join(60)
        assert not thread.is_alive(), "runner did not stop"
        assert not errors, errors


def app_for(topic: str, schema: str, group: str) -> App:
    return make_app(topic, schema, group)


def start_worker(
    bootstrap: str, database_url: str, topic: str, group: str, schema: str,
    *, failpoints: str = "", sleep: float = 0.0, processes: int = 1,
    kafka: dict[str, str] | None = None, env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:  # fmt: skip
    """``kinbox worker tests.integration.inbox_app:app`` as a real process."""
    environ = {
        **os.environ,
        "KINBOX_BOOTSTRAP_SERVERS": bootstrap,
        "KINBOX_DATABASE_URL": database_url,
        "KINBOX_GROUP_ID": group,
        "KINBOX_SCHEMA": schema,
        "KINBOX_SESSION_TIMEOUT": "6",
        "KINBOX_MAX_POLL_INTERVAL": "30",
        "KINBOX_RETRY_INITIAL": "0.1",
        "KINBOX_RETRY_MAX": "1",
        "KINBOX_FAILPOINTS": failpoints,
        "INBOX_TEST_TOPIC": topic,
        "INBOX_TEST_SLEEP": str(sleep),
        **(env or {}),
    }
    args = [sys.executable, "-m", "kinbox.cli.main", "worker", "tests.integration.inbox_app:app"]
    args += ["--processes", str(processes)]
    for key, value in (FAST_GROUP if kafka is None else kafka).items():
        args += ["-X", f"{key}={value}"]
    return subprocess.Popen(args, cwd=ROOT, env=environ)
