"""The console tests' world: real dead letters made by a real worker, and real console processes.

:func:`make_dead_letters` migrates a schema, runs ``kinbox worker`` on
:mod:`tests.console.console_app` over a fresh topic and produces events of
every kind the app fails on, plus good ones, then waits until the group has
committed past all of them: the dead letters are in ``<topic>.dlq`` and their
verdicts in ``processed_events``. The worker keeps running, so a replay is
applied by it. :func:`start_console` runs ``kinbox console`` from the CLI and
reads the URL it prints.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from kinbox.store.decisions import CONSOLE
from kinbox.store.postgres import apply_migrations
from kinbox.store.schema import INBOX
from producer_outbox.schema import OUTBOX
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "Hunter2-sekret-Zq9"
"""The database password in the consoles' URL: no page, JSON or log line may show it."""
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync",
]  # fmt: skip
HOSTILE_PAYLOAD = (
    b'{"kind": "hostile", "html": "<script>window.__pwned = \'payload\'</script>'
    b'<img src=x onerror=\\"window.__pwned = \'img\'\\">"}'
)
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01".encode()
HOSTILE_HEADER = b"<script>window.__pwned = 'header'</script><b>loud</b>"


def with_password(url: str, password: str = PASSWORD) -> str:
    """``url`` with ``password`` set (the test cluster trusts every local login)."""
    parts = urlsplit(url)
    user = parts.username or "postgres"
    host = f"{user}:{password}@{parts.hostname}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


@dataclass
class DeadLetters:
    """What :func:`make_dead_letters` made."""

    schema: str
    topic: str
    group: str
    broken: Path
    worker: subprocess.Popen[bytes]
    ids: dict[str, list[str]] = field(default_factory=dict)
    """Event ids by kind (``good``, ``poison``, ``refuse``, ``hostile``, ``leak``)."""

    @property
    def dlq(self) -> str:
        """The dead-letter topic."""
        return f"{self.topic}.dlq"


def make_dead_letters(bootstrap: str, database_url: str) -> DeadLetters:
    """Dead letters of four causes (and one record without an event id), made by a worker."""
    schema = f"kbc_{uuid.uuid4().hex[:10]}"
    apply_migrations(database_url, schema, [INBOX, CONSOLE, OUTBOX])
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {}.console_effects (seq bigserial PRIMARY KEY, event_id text)"
            ).format(sql.Identifier(schema))
        )
    topic = f"console-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics(
        [NewTopic(topic, 2, 1), NewTopic(f"{topic}.dlq", 2, 1)]
    ).values():
        future.result(timeout=30)
    broken = Path(tempfile.mkdtemp(prefix="kinbox-console-")) / "broken"
    broken.touch()
    group = f"g-{topic}"
    worker = start_worker(bootstrap, database_url, schema, topic, group, broken)
    made = DeadLetters(schema, topic, group, broken, worker)
    made.ids = {
        "good": produce(bootstrap, topic, [{"kind": "good", "n": n} for n in range(4)]),
        "poison": produce(bootstrap, topic, [{"kind": "poison", "amount": "12,5x"}] * 2),
        "refuse": produce(bootstrap, topic, [{"kind": "refuse", "customer": c}
                                             for c in (17, 4711, 99)],
                          headers=[("traceparent", TRACEPARENT)]),
        "hostile": produce(bootstrap, topic, [], raw=[HOSTILE_PAYLOAD],
                           headers=[("x-note", HOSTILE_HEADER)]),
        "leak": produce(bootstrap, topic, [{"kind": "leak"}]),
    }  # fmt: skip
    produce(bootstrap, topic, [], raw=[b'{"kind": "no id"}'], with_id=False)
    expected = sum(len(v) for v in made.ids.values()) + 1
    rows = sql.SQL("SELECT count(*) FROM {}.processed_events").format(sql.Identifier(schema))
    with psycopg.connect(database_url, autocommit=True) as conn:
        wait_for(lambda: conn.execute(rows).fetchone() == (expected,), 120,
                 f"{expected} verdicts in processed_events")  # fmt: skip
    return made


def start_worker(
    bootstrap: str, database_url: str, schema: str, topic: str, group: str, broken: Path
) -> subprocess.Popen[bytes]:
    """``kinbox worker tests.console.console_app:app`` as a real process."""
    env = {
        **os.environ,
        "KINBOX_BOOTSTRAP_SERVERS": bootstrap,
        "KINBOX_DATABASE_URL": with_password(database_url),
        "KINBOX_GROUP_ID": group,
        "KINBOX_SCHEMA": schema,
        "KINBOX_MAX_ATTEMPTS": "2",
        "KINBOX_RETRY_INITIAL": "0.05",
        "KINBOX_RETRY_MAX": "0.2",
        "KINBOX_SESSION_TIMEOUT": "6",
        "KINBOX_BREAKER_FAILURES": "0",
        "CONSOLE_TEST_TOPIC": topic,
        "CONSOLE_TEST_BROKEN": str(broken),
    }
    env.pop("KINBOX_FAILPOINTS", None)
    command = [sys.executable, "-m", "kinbox", "worker", "tests.console.console_app:app",
               "-X", "heartbeat.interval.ms=500"]  # fmt: skip
    return subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)


def produce(
    bootstrap: str, topic: str, payloads: Sequence[dict[str, Any]], *,
    raw: Sequence[bytes] = (), headers: Sequence[tuple[str, bytes]] = (), with_id: bool = True,
    key: bytes | None = None,
) -> list[str]:  # fmt: skip
    """One record per payload (or raw value), each with a fresh ``event-id``; return the ids.

    Each record's key is its event id, or ``key`` for them all.
    """
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    ids = []
    for value in [json.dumps(p).encode() for p in payloads] + list(raw):
        event_id = str(uuid.uuid4())
        extra = [("event-id", event_id.encode())] if with_id else []
        ids.append(event_id)
        producer.produce(topic, value, key=key or event_id.encode(), headers=[*extra, *headers])
    assert producer.flush(30) == 0
    return ids if with_id else []


def park_outbox_row(database_url: str, schema: str, key: str) -> str:
    """A parked (dead) outbox row of ``key``, as the relay leaves one; return its id."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "INSERT INTO {}.outbox (id, topic, aggregatetype, aggregateid, payload, status,"
                " attempts, last_error) VALUES (gen_random_uuid(), 'orders', 'orders', %s,"
                " '{{}}', 'dead', 10, 'MSG_SIZE_TOO_LARGE') RETURNING id::text"
            ).format(sql.Identifier(schema)),
            (key,),
        ).fetchone()
    assert row is not None
    return str(row[0])


@dataclass
class ConsoleProcess:
    """A running ``kinbox console``."""

    proc: subprocess.Popen[str]
    base: str
    token: str
    log_path: Path

    @property
    def login_url(self) -> str:
        """The URL the console printed."""
        return f"{self.base}/login?token={self.token}"

    def log(self) -> str:
        """What it wrote to stderr."""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, then wait."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


_URL = re.compile(r"open (http://\S+)/login\?token=(\S+)")


def start_console(
    bootstrap: str, database_url: str, schema: str, *args: str, env: dict[str, str] | None = None
) -> ConsoleProcess:
    """``kinbox console --port 0 ... [args]`` from the CLI; wait for the URL it prints."""
    log_path = Path(tempfile.mkstemp(prefix="kinbox-console-", suffix=".log")[1])
    environ = {**os.environ, **(env or {})}
    environ.pop("KINBOX_CONSOLE_TOKEN", None)
    command = [sys.executable, "-m", "kinbox", "console", "--port", "0",
               "--bootstrap-servers", bootstrap, "--database-url", with_password(database_url),
               "--schema", schema, "--sample-interval", "2", *args]  # fmt: skip
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=environ, stdout=subprocess.PIPE,
                                stderr=log, text=True)  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = _URL.search(line)
    if found is None:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        raise AssertionError(f"no URL printed: {line!r}\n{log_path.read_text()}")
    return ConsoleProcess(proc, found.group(1), found.group(2), log_path)
