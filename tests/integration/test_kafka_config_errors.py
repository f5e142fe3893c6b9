"""A librdkafka property that librdkafka refuses exits with the configuration code, not "connect".

Real commands, as an operator runs them, pointed at the real broker and the
real (migrated) database: every service is reachable, so only the bad ``-X``
can be what stops them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from kinbox.cli.support import EXIT_CONFIG
from kinbox.devstack.stack import Stack
from kinbox.store.postgres import apply_migrations
from kinbox.store.schema import INBOX
from tests.conftest import MakeTopic
from tests.support.database import Conn
from tests.support.launch import ROOT
from tests.support.outbox import migrate_outbox

BAD = [
    (["-X", "no.such.property=1"], "no.such.property"),
    (["-X", "acks=banana"], "request.required.acks"),
]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kinbox", *args],
        cwd=ROOT,
        env={**os.environ, "KINBOX_LOG_LEVEL": "WARNING"},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(("bad", "named"), BAD)
def test_worker_exits_2_on_a_refused_property(
    stack: Stack, schema: str, bad: list[str], named: str
) -> None:
    apply_migrations(stack.database_url, schema, [INBOX])
    done = _run(
        "worker", "tests.unit.sample_app:app",
        "--bootstrap-servers", stack.bootstrap_servers, "--database-url", stack.database_url,
        "--schema", schema, "--group-id", f"g-{uuid.uuid4().hex[:8]}", *bad,
    )  # fmt: skip
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "invalid Kafka configuration for the consumer" in done.stderr and named in done.stderr


def test_worker_processes_exit_2_on_a_refused_property(stack: Stack, schema: str) -> None:
    # Every member refuses it; the supervisor stops and passes the status on
    apply_migrations(stack.database_url, schema, [INBOX])
    done = _run(
        "worker", "tests.unit.sample_app:app", "--processes", "2",
        "--bootstrap-servers", stack.bootstrap_servers, "--database-url", stack.database_url,
        "--schema", schema, "--group-id", f"g-{uuid.uuid4().hex[:8]}", *BAD[0][0],
    )  # fmt: skip
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert BAD[0][1] in done.stderr


@pytest.mark.parametrize(("bad", "named"), BAD)
def test_outbox_relay_exits_2_on_a_refused_property(
    stack: Stack, schema: str, db: Conn, bad: list[str], named: str
) -> None:
    migrate_outbox(db, schema)
    done = _run(
        "outbox", "relay", "--database-url", stack.database_url, "--schema", schema,
        "--bootstrap-servers", stack.bootstrap_servers, *bad,
    )  # fmt: skip
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "invalid Kafka configuration" in done.stderr and named in done.stderr


@pytest.mark.parametrize(("bad", "named"), BAD)
@pytest.mark.parametrize("dry_run", [False, True])
def test_dlq_replay_exits_2_on_a_refused_property(
    stack: Stack, make_topic: MakeTopic, bad: list[str], named: str, dry_run: bool
) -> None:
    topic = make_topic(partitions=1)
    args = ["dlq", "replay", "--topic", topic, "--bootstrap-servers", stack.bootstrap_servers]
    done = _run(*args, *(["--dry-run"] if dry_run else []), *bad)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "invalid Kafka configuration" in done.stderr and named in done.stderr
