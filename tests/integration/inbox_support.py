"""Helpers for the inbox integration tests: producing, runners and workers, invariant checks.

The schema, the waiting, the producer and the group timings are the shared
ones of tests/support (``database``, ``waiting``, ``records``, ``launch``).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from psycopg import sql

from kinbox.app import App
from kinbox.consume.runner import Runner
from kinbox.core.config import Settings
from kinbox.kafka import KafkaTransport, dead_letter_publisher
from kinbox.store.awaiting import MixedInboxStore
from tests.integration.inbox_app import make_app
from tests.support.database import Conn
from tests.support.launch import FAST_GROUP, FAST_TIMINGS, ROOT, timing_env, worker_argv
from tests.support.records import Headers, write_records
from tests.support.records import committed as committed  # re-exported for the inbox tests

APP = "tests.integration.inbox_app:app"
Produced = dict[tuple[int, int], str]
"""(partition, offset) -> event id, from the producer's delivery reports."""


def produce(
    bootstrap: str, topic: str, events: Sequence[tuple[str, int]], produced: Produced | None = None
) -> Produced:
    """Send ``(event_id, partition)`` pairs with an ``event-id`` header; return their offsets.

    ``produced``: a mapping to add them to (a test producing in several steps).
    """
    out: Produced = {} if produced is None else produced
    items: list[tuple[int, Headers, str | None]] = [
        (partition, [("event-id", event_id.encode())], event_id) for event_id, partition in events
    ]
    out.update(write_records(bootstrap, topic, items))
    return out


def effects(db: Conn, schema: str, consumer: str | None = None) -> list[tuple[Any, ...]]:
    """``(consumer, event_id, partition, offset, pid)`` effect rows in the order applied."""
    query = sql.SQL(
        'SELECT consumer, event_id, partition, "offset", pid FROM {}.effects ORDER BY seq'
    ).format(sql.Identifier(schema))
    rows = db.execute(query).fetchall()
    return [r for r in rows if consumer is None or r[0] == consumer]


def processed_ids(db: Conn, schema: str, consumer: str) -> set[str]:
    """Event ids ``consumer`` recorded in ``processed_events``, whatever their status."""
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


def settings(bootstrap: str, database_url: str, group: str, schema: str, **kw: Any) -> Settings:
    """A member's settings with the tests' short timings (:data:`FAST_TIMINGS`), ``kw`` on top."""
    overrides = {**FAST_GROUP, **kw.pop("kafka_overrides", {})}
    return Settings(
        bootstrap_servers=bootstrap, database_url=database_url, group_id=group, schema=schema,
        kafka_overrides=overrides, **{**FAST_TIMINGS, **kw},
    ).validate()  # fmt: skip


@contextmanager
def running(app: App, config: Settings, *, dead_letters: bool = False) -> Iterator[Runner]:
    """Run a real group member (real Kafka, real PostgreSQL) in a thread.

    ``dead_letters`` gives it a real dead-letter publisher, as ``kinbox worker`` has.
    """
    store = MixedInboxStore(config.database_url, schema=config.schema, consumer=config.group_id)
    store.open()
    publisher = dead_letter_publisher(config) if dead_letters else None
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
    """The inbox tests' app (:mod:`tests.integration.inbox_app`) on ``topic``."""
    return make_app(topic, schema, group)


def start_worker(
    bootstrap: str, database_url: str, topic: str, group: str, schema: str,
    *, failpoints: str = "", sleep: float = 0.0, processes: int = 1,
    kafka: Mapping[str, str | None] | None = None, env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:  # fmt: skip
    """``kinbox worker tests.integration.inbox_app:app`` as a real process (fast timings)."""
    environ = worker_env(
        bootstrap, database_url, topic, group, schema,
        KINBOX_FAILPOINTS=failpoints, INBOX_TEST_SLEEP=str(sleep), **(env or {}),
    )  # fmt: skip
    argv = worker_argv(APP, ["--processes", str(processes)], FAST_GROUP if kafka is None else kafka)
    return subprocess.Popen(argv, cwd=ROOT, env=environ)


def worker_env(
    bootstrap: str, database_url: str, topic: str, group: str, schema: str, **extra: str
) -> dict[str, str]:
    """The environment of a ``kinbox worker`` of a test app: fast timings, ``extra`` on top.

    The test run's own ``OTEL_*`` are left out: a worker's telemetry is what
    its test gives it.
    """
    return {
        **{name: value for name, value in os.environ.items() if not name.startswith("OTEL_")},
        **timing_env(),
        "KINBOX_BOOTSTRAP_SERVERS": bootstrap,
        "KINBOX_DATABASE_URL": database_url,
        "KINBOX_GROUP_ID": group,
        "KINBOX_SCHEMA": schema,
        "INBOX_TEST_TOPIC": topic,
        **extra,
    }
