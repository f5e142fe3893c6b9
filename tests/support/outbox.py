"""The outbox in tests: migrate it, enqueue, run relays (in a thread or as processes), read back.

Shared by the outbox integration tests and the fault suite's relay
scenarios; a topic is read back with a group-less consumer of its own, so
reading never disturbs the group under test.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import Consumer
from psycopg import sql

from kinbox.core.errors import StoreError
from kinbox.devstack.stack import Stack
from kinbox.store.migrations import migrate
from producer_outbox.config import RelayConfig
from producer_outbox.producer import producer_config, relay_publisher
from producer_outbox.relay import Relay
from producer_outbox.schema import OUTBOX
from producer_outbox.telemetry import RelayTelemetry
from tests.support.database import Conn
from tests.support.launch import ROOT
from tests.support.records import Produced


@dataclass(frozen=True)
class Received:
    """One record read back from Kafka."""

    key: str | None
    value: bytes
    event_id: str
    headers: dict[str, bytes]
    partition: int
    offset: int


def migrate_outbox(db: Conn, schema: str) -> None:
    """Create the outbox tables in ``schema``."""
    migrate(db, schema, [OUTBOX])


def count(db: Conn, schema: str, where: str = "true") -> int:
    """Outbox rows matching ``where`` (a literal condition written by the test)."""
    query = sql.SQL("SELECT count(*) FROM {}.outbox WHERE " + where).format(sql.Identifier(schema))
    row = db.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def wait_all_sent(database_url: str, schema: str, timeout: float = 90.0) -> int:
    """Wait until every outbox row is marked sent (the writers stopped); return how many."""
    from tests.support.waiting import wait_for

    with psycopg.connect(database_url, autocommit=True) as db:
        total = count(db, schema)
        wait_for(lambda: count(db, schema, "status = 'sent'") == total, timeout,
                 f"{total} outbox rows sent")  # fmt: skip
    return total


def consume(
    stack: Stack,
    topic: str,
    expected: int,
    *,
    timeout: float = 60.0,
    linger: float = 1.0,
    keep: Callable[[Received], bool] = lambda _record: True,
    bootstrap_servers: str | None = None,
) -> list[Received]:
    """Read ``topic`` from the start until ``expected`` records came (and ``linger`` s more).

    ``keep`` selects the records that count (and are returned), for a shared topic.
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers or stack.bootstrap_servers,
            "group.id": f"outbox-test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": "false",
        }
    )
    consumer.subscribe([topic])
    received: list[Received] = []
    deadline = time.monotonic() + timeout
    extra_until: float | None = None
    try:
        while time.monotonic() < deadline:
            if extra_until is not None and time.monotonic() > extra_until:
                break
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            raw_headers = message.headers() or []
            pairs = raw_headers.items() if isinstance(raw_headers, dict) else raw_headers
            headers = {
                name: value.encode() if isinstance(value, str) else value or b""
                for name, value in pairs
            }
            key = message.key()
            record = Received(
                key=key.decode() if isinstance(key, bytes) else key,
                value=bytes(message.value() or b""),
                event_id=(headers.get("event-id") or b"").decode(),
                headers=headers,
                partition=message.partition() or 0,
                offset=message.offset() or 0,
            )
            if keep(record):
                received.append(record)
            if len(received) >= expected and extra_until is None:
                extra_until = time.monotonic() + linger
    finally:
        consumer.close()
    return received


def first_deliveries(received: Sequence[Received]) -> dict[str | None, list[Received]]:
    """Per key, the first delivery of each event, in (partition, offset) order.

    Later copies (a relay's retry re-publishes a batch) are left out: the
    order a key promises is the order its events first appear.
    """
    seen: set[str] = set()
    by_key: dict[str | None, list[Received]] = {}
    for record in sorted(received, key=lambda r: (r.partition, r.offset)):
        if record.event_id not in seen:
            seen.add(record.event_id)
            by_key.setdefault(record.key, []).append(record)
    return by_key


def as_produced(topic: str, partitions: int, received: Sequence[Received]) -> Produced:
    """What the relays published, as the fault suite's :class:`Produced` (for its drain)."""
    return Produced(topic, partitions, {(r.partition, r.offset): r.event_id for r in received})


def assert_key_order(received: Sequence[Received]) -> None:
    """Per key, the first delivery of each row comes in write order (payload ``n`` increasing)."""
    for key, records in first_deliveries(received).items():
        ns = [json.loads(record.value)["n"] for record in records]
        assert ns == sorted(ns), f"key {key!r} first published out of order: {ns}"


def relay_config(stack: Stack, schema: str, **overrides: Any) -> RelayConfig:
    """A relay's configuration on the test database, quick to poll, ``overrides`` on top."""
    settings: dict[str, Any] = {"poll_interval": 0.2, "batch_size": 50, "lanes": 8}
    settings.update(overrides)
    return RelayConfig(database_url=stack.database_url, schema=schema, **settings)


@contextmanager
def running_relay(
    stack: Stack,
    schema: str,
    *,
    kafka: dict[str, str] | None = None,
    bootstrap_servers: str | None = None,
    telemetry: RelayTelemetry | None = None,
    **overrides: Any,
) -> Iterator[Relay]:
    """Run an in-process relay in a thread; stop it gracefully on exit."""
    publisher = relay_publisher(
        producer_config(bootstrap_servers or stack.bootstrap_servers, kafka or {})
    )
    relay = Relay(relay_config(stack, schema, **overrides), publisher, telemetry=telemetry)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            relay.run()
        except BaseException as exc:  # surfaced to the test below
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        relay.stop()
        thread.join(60)
        publisher.close()
    assert not thread.is_alive(), "relay did not stop"
    assert not errors, errors


def relay_process(
    stack: Stack, schema: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``kinbox outbox relay`` as a real process (``python -m kinbox outbox relay``)."""
    command = [
        sys.executable,
        "-m",
        "kinbox",
        "outbox",
        "relay",
        "--poll-interval",
        "0.2",
        *args,
    ]
    environ = {
        **os.environ,
        "KINBOX_DATABASE_URL": stack.database_url,
        "KINBOX_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        "KINBOX_SCHEMA": schema,
        **(env or {}),
    }
    environ.pop("KINBOX_FAILPOINTS", None) if env is None else None
    # Logs go to the inherited stderr, which pytest captures and shows on failure.
    return subprocess.Popen(command, env=environ, cwd=ROOT)


def stop_relay(relay: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """SIGTERM a relay process and return its exit status; SIGKILL it and fail if it hangs."""
    relay.send_signal(signal.SIGTERM)
    try:
        return relay.wait(timeout)
    except subprocess.TimeoutExpired:
        relay.kill()
        raise AssertionError(f"relay ignored SIGTERM for {timeout:.0f}s") from None


def enqueue_many(
    db_url: str, schema: str, topic: str, items: Sequence[tuple[str | None, int]]
) -> None:
    """Enqueue ``(key, n)`` payloads, one transaction per item."""
    from producer_outbox.writer import enqueue

    with psycopg.connect(db_url) as conn:
        for key, n in items:
            with conn.transaction():
                enqueue(conn, topic, {"key": key, "n": n}, key=key, schema=schema)


def outbox_command(stack: Stack, schema: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``kinbox outbox <args>`` against the test database as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "kinbox", "outbox", *args,
         "--database-url", stack.database_url, "--schema", schema],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
        env={**os.environ, "KINBOX_BOOTSTRAP_SERVERS": stack.bootstrap_servers},
    )  # fmt: skip


def same_lane_key(db: Conn, key: str, lanes: int, *, prefix: str = "probe") -> str:
    """Return a key other than ``key`` that hashes into ``key``'s lane (same claim, same relay)."""
    row = db.execute(
        "SELECT c FROM (SELECT %s || n AS c FROM generate_series(1, 10000) AS n) AS k"
        " WHERE (hashtext(c) & 2147483647) %% %s = (hashtext(%s) & 2147483647) %% %s LIMIT 1",
        (prefix, lanes, key, lanes),
    ).fetchone()
    assert row is not None
    return str(row[0])


def key_of_every_lane(db: Conn, lanes: int, *, prefix: str = "lane") -> list[str]:
    """One key per lane (``lanes`` keys, lane 0 first): rows of them reach every lane group."""
    rows = db.execute(
        "SELECT DISTINCT ON (lane) c FROM (SELECT %s || n AS c,"
        " (hashtext(%s || n) & 2147483647) %% %s AS lane FROM generate_series(1, 10000) AS n) AS k"
        " ORDER BY lane, c",
        (prefix, prefix, lanes),
    ).fetchall()
    assert len(rows) == lanes
    return [str(row[0]) for row in rows]


def outbox_rows(db: Conn, schema: str, where: str = "true") -> list[tuple[Any, ...]]:
    """``(id, key, status, attempts, last_error)`` of the rows, in publishing order."""
    query = sql.SQL(
        "SELECT id::text, aggregateid, status, attempts, last_error FROM {}.outbox WHERE "
        + where
        + " ORDER BY txid, seq"
    ).format(sql.Identifier(schema))
    return db.execute(query).fetchall()


@dataclass
class RowWriter:
    """Commits outbox rows of ``keys``, one transaction each, until :attr:`stop` is set.

    For a thread beside relays under faults: a database that restarts costs
    it a reconnect, not its life (a COMMIT whose answer was lost may or may
    not have happened; the outbox table says which at the end).
    """

    database_url: str
    schema: str
    topic: str
    keys: Sequence[str]
    rng: random.Random
    stop: threading.Event = field(default_factory=threading.Event)
    commits: int = 0
    """Rows whose COMMIT was answered."""
    outages: int = 0

    def run(self) -> None:
        """Write until stopped (the thread's target)."""
        from producer_outbox.writer import enqueue

        while not self.stop.is_set():
            try:
                with psycopg.connect(self.database_url, connect_timeout=3) as conn:
                    while not self.stop.is_set():
                        key = self.rng.choice(self.keys)
                        with conn.transaction():
                            enqueue(conn, self.topic, {"n": self.commits}, key=key,
                                    schema=self.schema)  # fmt: skip
                        self.commits += 1
                        time.sleep(self.rng.uniform(0.002, 0.02))
            except (psycopg.OperationalError, StoreError) as exc:
                if isinstance(exc, StoreError) and not exc.transient:
                    raise
                self.outages += 1
                time.sleep(0.2)
