"""Graceful shutdown of a real `kinbox worker`: finish the batch, a second signal, a timeout."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from kinbox.devstack.stack import Stack
from kinbox.ops.exits import EXIT_INTERRUPTED
from tests.conftest import MakeTopic
from tests.integration.inbox_support import committed, effects, produce, start_worker
from tests.support.database import Conn, prepare_schema, with_application_name, writing
from tests.support.waiting import wait_for


def _batch_in_flight(database_url: str, schema: str) -> bool:
    """This test's worker has its inbox transaction open: its claim ran, its handlers run.

    Only its own backend counts: the server is shared with the rest of the
    session, and another test's idle transaction (Connect's, say) must not
    make this one signal a worker that has not installed its handlers yet.
    And only a transaction that wrote (has an xid): the claim inserts the
    fresh events' rows, while the worker's start-up schema check reads in a
    transaction too, before the signal handlers exist (a SIGTERM seen then
    killed the worker with -15 in one full run).
    """
    return writing(database_url, schema)


@contextmanager
def _reaped(worker: subprocess.Popen[bytes]) -> Iterator[subprocess.Popen[bytes]]:
    """Yield ``worker``; SIGKILL and reap it if the test ends while it still runs."""
    try:
        yield worker
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def _three_events(stack: Stack, make_topic: MakeTopic, schema: str) -> tuple[str, str]:
    """A one-partition topic holding e0..e2, a migrated schema; returns (topic, group)."""
    topic = make_topic(partitions=1)
    prepare_schema(stack.database_url, schema)
    produce(stack.bootstrap_servers, topic, [(f"e{i}", 0) for i in range(3)])
    return topic, f"g-{uuid.uuid4().hex[:8]}"


def test_sigterm_finishes_the_batch_in_hand_and_commits_it(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    topic, group = _three_events(stack, make_topic, schema)
    named = with_application_name(stack.database_url, schema)
    addr = (stack.bootstrap_servers, named, topic, group, schema)
    with _reaped(start_worker(*addr, sleep=1.0)) as worker:
        wait_for(lambda: _batch_in_flight(stack.database_url, schema), what="a batch in flight")

        # When SIGTERM arrives while the handlers of a 3-event batch run
        worker.send_signal(signal.SIGTERM)

        # Then the worker finishes that batch, commits it and its offset, and exits 0
        assert worker.wait(60) == 0
    assert sorted(row[1] for row in effects(db, schema)) == ["e0", "e1", "e2"]
    assert committed(stack.bootstrap_servers, group, topic, 1) == {0: 3}


def test_second_signal_exits_at_once_and_nothing_is_lost(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    topic, group = _three_events(stack, make_topic, schema)
    named = with_application_name(stack.database_url, schema)
    addr = (stack.bootstrap_servers, named, topic, group, schema)
    with _reaped(start_worker(*addr, sleep=20.0)) as worker:
        wait_for(lambda: _batch_in_flight(stack.database_url, schema), what="a batch in flight")

        # When a second SIGTERM follows the first while a handler sleeps for 20 s
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        worker.send_signal(signal.SIGTERM)

        # Then the process exits at once (long before the handler would end),
        # with nothing committed anywhere
        assert worker.wait(10) == EXIT_INTERRUPTED
    assert effects(db, schema) == []
    assert committed(stack.bootstrap_servers, group, topic, 1) == {}

    # And a restarted worker applies every event exactly once
    with _reaped(start_worker(*addr)) as worker:
        wait_for(lambda: committed(stack.bootstrap_servers, group, topic, 1) == {0: 3})
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    assert sorted(row[1] for row in effects(db, schema)) == ["e0", "e1", "e2"]


def test_shutdown_timeout_bounds_a_graceful_stop(
    stack: Stack, make_topic: MakeTopic, schema: str, db: Conn
) -> None:
    topic, group = _three_events(stack, make_topic, schema)
    named = with_application_name(stack.database_url, schema)
    addr = (stack.bootstrap_servers, named, topic, group, schema)
    env = {"KINBOX_SHUTDOWN_TIMEOUT": "2"}
    with _reaped(start_worker(*addr, sleep=30.0, env=env)) as worker:
        wait_for(lambda: _batch_in_flight(stack.database_url, schema), what="a batch in flight")

        # When one SIGTERM arrives and the handler would need 30 s more
        worker.send_signal(signal.SIGTERM)

        # Then the worker gives up after its 2 s shutdown timeout, committing nothing
        assert worker.wait(20) == EXIT_INTERRUPTED
    assert effects(db, schema) == []
    assert committed(stack.bootstrap_servers, group, topic, 1) == {}
