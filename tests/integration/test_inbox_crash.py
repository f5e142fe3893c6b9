"""Real `kinbox worker` processes SIGKILLed at chosen moments, then restarted."""

from __future__ import annotations

import signal
import subprocess
import uuid

import pytest

from kinbox.devstack.stack import Stack
from tests.conftest import MakeTopic
from tests.integration.inbox_support import (
    assert_offsets_not_ahead,
    committed,
    effects,
    produce,
    start_worker,
)
from tests.support.database import Conn, prepare_schema
from tests.support.waiting import wait_for

N = 20


def _stop(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0


@pytest.mark.parametrize(
    ("failpoint", "effects_after_crash"),
    [
        # DB transaction committed, offset not: the restart redelivers, the inbox suppresses.
        ("after_db_commit=kill@1", N),
        # Handlers ran, COMMIT never happened: nothing applied; the restart applies it once.
        ("before_db_commit=kill@1", 0),
    ],
)
def test_sigkill_then_restart_applies_every_event_exactly_once(
    stack: Stack,
    make_topic: MakeTopic,
    schema: str,
    db: Conn,
    failpoint: str,
    effects_after_crash: int,
) -> None:
    # Given N events on a one-partition topic (so the first batch holds them all)
    topic = make_topic(partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    prepare_schema(stack.database_url, schema)
    produced = produce(stack.bootstrap_servers, topic, [(f"e{i}", 0) for i in range(N)])
    addr = (stack.bootstrap_servers, stack.database_url, topic, group, schema)

    # When the worker dies by SIGKILL at the failpoint
    worker = start_worker(*addr, failpoints=failpoint)
    assert worker.wait(60) == -signal.SIGKILL
    # Then no offset is committed, and the DB holds all of the batch or none of it
    assert committed(stack.bootstrap_servers, group, topic, 1) == {}
    assert len(effects(db, schema)) == effects_after_crash

    # When a new worker starts (no failpoint) and catches up
    worker = start_worker(*addr)
    try:
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: N})
    finally:
        _stop(worker)
    # Then every event was applied exactly once
    applied = [row[1] for row in effects(db, schema)]
    assert sorted(applied) == sorted(f"e{i}" for i in range(N))
    assert_offsets_not_ahead(db, schema, stack.bootstrap_servers, group, topic, 1, produced)


def test_worker_refuses_to_start_on_an_unmigrated_schema(
    stack: Stack, make_topic: MakeTopic, schema: str
) -> None:
    topic = make_topic(partitions=1)
    worker = start_worker(stack.bootstrap_servers, stack.database_url, topic, "g", schema)
    assert worker.wait(60) == 5  # EXIT_SCHEMA, with "run `kinbox migrate`" on stderr
