"""--log-format json: every line a real worker and a real relay write is one JSON object."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from kinbox.devstack.stack import Stack
from kinbox.store.postgres import apply_migrations
from kinbox.store.schema import INBOX
from producer_outbox import enqueue
from producer_outbox.schema import OUTBOX
from tests.integration.ops_support import ROOT, produce, start_worker, stop, topic_pair
from tests.support.waiting import wait_for

SECRET = "s3cret-pw"


def with_password(url: str) -> str:
    """The test server trusts loopback, so any password works: one to look for in the logs."""
    scheme, _, rest = url.partition("://")
    user, _, host = rest.partition("@")
    return f"{scheme}://{user}:{SECRET}@{host}"


def parse(path: Path) -> list[dict[str, Any]]:
    text = path.read_text()
    assert SECRET not in text
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "no log at all"
    return [json.loads(line) for line in lines]  # every line, or the test fails here


def test_a_worker_logs_one_json_object_a_line_with_the_record_position(
    stack: Stack, schema: str, tmp_path: Path
) -> None:
    # Given a worker logging JSON, its database URL carrying a password
    apply_migrations(stack.database_url, schema, [INBOX, OUTBOX])
    topic = topic_pair(stack.bootstrap_servers)
    log = tmp_path / "worker.log"
    group = f"g-{topic}"
    with log.open("wb") as sink:
        worker = start_worker(stack, topic, group, schema, database_url=with_password(
            stack.database_url), stderr=sink, global_args=["--log-format", "json"])  # fmt: skip
        try:
            # When it handles events, one of which it dead-letters
            produce(stack.bootstrap_servers, topic, [{"n": 1}, {"bad": True}, {"n": 3}])
            with psycopg.connect(stack.database_url, autocommit=True) as db:
                query = f"SELECT count(*) FROM {schema}.processed_events"
                wait_for(lambda: db.execute(query).fetchone() == (3,), 60, "3 rows")
        finally:
            assert stop(worker) == 0

    # Then every line parses, names its logger and level, and the dead
    # letter's line says where the record was
    records = parse(log)
    assert all({"time", "level", "logger", "pid", "message"} <= r.keys() for r in records)
    letters = [r for r in records if r["message"].startswith("dead-lettering")]
    assert len(letters) == 1, letters
    letter = letters[0]
    assert (letter["topic"], letter["partition"], letter["offset"]) == (topic, 0, 1)
    assert letter["group"] == group and letter["dlq_topic"] == f"{topic}.dlq"
    started = [r for r in records if r["message"].startswith("starting with Settings(")]
    assert started and "***" in started[0]["message"]
    assert any(r["logger"] == "kinbox.consume.runner" for r in records)


def test_the_relay_logs_one_json_object_a_line(stack: Stack, schema: str, tmp_path: Path) -> None:
    apply_migrations(stack.database_url, schema, [INBOX, OUTBOX])
    topic = topic_pair(stack.bootstrap_servers)
    with psycopg.connect(stack.database_url) as conn, conn.transaction():
        enqueue(conn, topic, {"n": 1}, key="k", schema=schema)
    log = tmp_path / "relay.log"
    command = [
        sys.executable, "-m", "kinbox", "--log-format", "json", "outbox", "relay",
        "--database-url", with_password(stack.database_url), "--schema", schema,
        "--bootstrap-servers", stack.bootstrap_servers, "--poll-interval", "0.2",
    ]  # fmt: skip
    with log.open("wb") as sink:
        relay = subprocess.Popen(command, cwd=ROOT, stderr=sink)
        try:
            with psycopg.connect(stack.database_url, autocommit=True) as db:
                query = f"SELECT count(*) FROM {schema}.outbox WHERE status = 'sent'"
                wait_for(lambda: db.execute(query).fetchone() == (1,), 60, "the row sent")
            time.sleep(0.5)
        finally:
            assert stop(relay) == 0
    records = parse(log)
    messages = [r["message"] for r in records]
    assert any(m.startswith("outbox relay started") for m in messages), messages
    assert any("***" in m for m in messages if m.startswith("outbox relay: kafka=")), messages
