"""The README's demo: outbox → Kafka → inbox, end to end, on the local stack.

What it does, with the same commands a user types:

1. ``kinbox migrate`` creates the kinbox tables; the example creates its own.
2. ``kinbox outbox relay`` and ``kinbox worker examples.lessons.app:app`` start.
3. CompleteLesson runs for a few users and lessons, each a business
   transaction that also writes its event into the outbox; a few of them roll
   back on purpose (no event may appear for those).
4. The first relay is armed to SIGKILL itself after Kafka acknowledged a batch
   but before the batch was marked sent, so a restarted relay publishes it
   again; on top, some events are re-published by hand with the same event id.
5. When the worker has caught up, a report compares what was written, what
   Kafka delivered and what the handler applied.

Run it with ``make demo`` (or ``python -m examples.lessons.demo``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from examples.lessons.app import TOPIC, complete_lesson, create_tables
from kinbox.devstack.stack import local_stack

PARTITIONS = 3


@dataclass(frozen=True)
class Report:
    """What the demo measured, all read back from PostgreSQL and Kafka."""

    completions: int
    rolled_back: int
    outbox_sent: int
    relay_killed: bool
    duplicates_injected: int
    deliveries: int
    applied: int
    distinct_applied: int
    events_of_rolled_back: int

    @property
    def exactly_once(self) -> bool:
        """Every committed completion applied once; nothing from rolled-back ones."""
        return (
            self.applied == self.distinct_applied == self.completions
            and self.events_of_rolled_back == 0
        )

    def lines(self) -> list[str]:
        """The report as printed."""
        rows: list[tuple[str, object]] = [
            ("CompleteLesson committed (events in the outbox)", self.completions),
            ("CompleteLesson rolled back (must publish none)", self.rolled_back),
            ("outbox rows published by the relay", self.outbox_sent),
            ("relay SIGKILLed after publish, before marking", self.relay_killed),
            ("duplicates re-published by hand (same event id)", self.duplicates_injected),
            (f"deliveries in {TOPIC} (incl. duplicates)", self.deliveries),
            ("handler applications", self.applied),
            ("distinct events applied", self.distinct_applied),
            ("events seen from rolled-back transactions", self.events_of_rolled_back),
        ]
        return [f"{label:<48} {value!s:>6}" for label, value in rows] + [
            "exactly once: " + ("YES" if self.exactly_once else "NO")
        ]


class _Service:
    """A kinbox command running in the background, its output in a log file."""

    def __init__(self, name: str, argv: list[str], logdir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = logdir / f"{name}.log"
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _kinbox(*args: str) -> list[str]:
    return [sys.executable, "-m", "kinbox", *args]


def _wait(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"demo: gave up waiting for {what} after {timeout:.0f}s")
        time.sleep(0.2)


def _offsets(bootstrap: str, group: str) -> tuple[int, int]:
    """(sum of end offsets of the topic, sum of the group's committed offsets)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        end = sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts)
        done = sum(max(tp.offset, 0) for tp in consumer.committed(parts, timeout=10))
        return end, done
    finally:
        consumer.close()


def _ensure_topic(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if TOPIC not in admin.list_topics(timeout=10).topics:
        future = admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])[TOPIC]
        future.result(30)


def run(
    bootstrap: str,
    database_url: str,
    *,
    schema: str = "kinbox",
    group: str = "progress-service",
    users: int = 5,
    lessons: int = 8,
    duplicates: int = 10,
    say: Callable[[str], None] = print,
) -> Report:
    """Run the whole flow against running services and return what was measured."""
    # The example's business tables are unqualified: give them the schema too.
    url = f"{database_url}{'&' if '?' in database_url else '?'}options=" + quote(
        f"-c search_path={schema},public"
    )
    common = ["--database-url", url, "--bootstrap-servers", bootstrap, "--schema", schema]
    say(f"$ kinbox migrate --schema {schema}")
    subprocess.run(_kinbox("migrate", "--database-url", url, "--schema", schema), check=True)
    with psycopg.connect(url, autocommit=True) as conn:
        create_tables(conn)
    _ensure_topic(bootstrap)
    logdir = Path(tempfile.mkdtemp(prefix="kinbox-demo-"))
    say(f"$ kinbox outbox relay & kinbox worker examples.lessons.app:app   (logs in {logdir})")
    relay = _Service(
        "relay-1",
        _kinbox("outbox", "relay", *common, "--batch-size", "10"),
        logdir,
        # Die by SIGKILL right after Kafka acknowledged the 2nd batch, before marking it sent.
        {"KINBOX_FAILPOINTS": "relay_after_publish=kill@2"},
    )
    worker = _Service(
        "worker", _kinbox("worker", "examples.lessons.app:app", *common, "--group-id", group),
        logdir, {},
    )  # fmt: skip
    services = [relay, worker]
    ids: list[uuid.UUID] = []
    rolled_back_users: list[str] = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for lesson in range(lessons):
                for user in range(users):
                    ids.append(
                        complete_lesson(conn, f"user-{user}", f"lesson-{lesson}", schema=schema)
                    )
                # One business transaction per lesson fails after writing its event.
                ghost = f"ghost-{uuid.uuid4().hex[:6]}"
                try:
                    with conn.transaction():
                        complete_lesson(conn, ghost, f"lesson-{lesson}", schema=schema)
                        raise RuntimeError("payment declined")  # the business rule says no
                except RuntimeError:
                    rolled_back_users.append(ghost)
                time.sleep(0.05)
        say(f"CompleteLesson: {len(ids)} committed, {len(rolled_back_users)} rolled back")
        _wait(lambda: relay.process.poll() is not None, "the relay's planned crash")
        relay_killed = relay.process.returncode == -signal.SIGKILL
        say(f"relay-1 exited with {relay.process.returncode} (SIGKILL by failpoint); restarting")
        services.append(_Service("relay-2", _kinbox("outbox", "relay", *common), logdir, {}))
        _wait(lambda: _unsent(url, schema) == 0, "the outbox to drain")
        producer = Producer({"bootstrap.servers": bootstrap})
        for event_id in ids[:duplicates]:
            value = b'{"event": "lesson.completed", "userId": "x", "lessonId": "y"}'
            producer.produce(TOPIC, value, headers=[("event-id", str(event_id).encode())])
        producer.flush(30)
        end: list[int] = [0]

        def caught_up() -> bool:
            end[0], done = _offsets(bootstrap, group)
            return done == end[0]

        _wait(caught_up, "the worker to commit every offset")
    finally:
        for service in reversed(services):
            service.stop()
    with psycopg.connect(url) as conn:
        applied, distinct = _one(
            conn,
            "SELECT count(*), count(DISTINCT event_id) FROM lesson_applications"
            " WHERE event_id = ANY(%s)",
            [str(i) for i in ids],
        )
        ghosts, _ = _one(
            conn,
            "SELECT count(*), 0 FROM lesson_progress WHERE user_id = ANY(%s)",
            rolled_back_users,
        )
        sent = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.outbox WHERE status = 'sent'").format(
                sql.Identifier(schema)
            )
        ).fetchone()
    return Report(
        completions=len(ids),
        rolled_back=len(rolled_back_users),
        outbox_sent=int(sent[0]) if sent else 0,
        relay_killed=relay_killed,
        duplicates_injected=duplicates,
        deliveries=end[0],
        applied=applied,
        distinct_applied=distinct,
        events_of_rolled_back=ghosts,
    )


def _one(conn: psycopg.Connection[Any], query: str, ids: list[str]) -> tuple[int, int]:
    row = conn.execute(query, (ids,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _unsent(url: str, schema: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.outbox WHERE status <> 'sent'").format(
                sql.Identifier(schema)
            )
        ).fetchone()
        return int(row[0]) if row else -1


def main() -> None:
    """Start the local stack, run the demo, print the report; exit 1 if it is not exactly once."""
    with local_stack() as stack:
        print(stack.describe())
        report = run(stack.bootstrap_servers, stack.database_url)
    print("\n".join(["", "kinbox demo report", "------------------", *report.lines()]))
    sys.exit(0 if report.exactly_once else 1)


if __name__ == "__main__":
    main()
