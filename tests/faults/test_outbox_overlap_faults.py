"""Scenario 12b: the outbox relay SIGKILLed while both of its lane groups have a batch in flight.

A relay runs its lanes in two lane groups (``--parallel 2``), each with a
batch open at once: claimed and locked, produced, waiting for delivery reports
or for its COMMIT. A real ``kinbox outbox relay`` SIGKILLs itself at the
``relay_after_publish_overlapped`` failpoint: one group's batch acknowledged
by Kafka and not yet marked, while the other group's batch is open too. A
writer keeps committing rows meanwhile; then two relays (two groups each) are
started and drain everything; a real ``kinbox worker`` consumes the topic.

Then nothing is lost: every committed row is in the topic and marked sent; the
two batches in flight come back at most once more each (duplicates: at least
one, at most two batches); each key's first deliveries come in exactly the
outbox's ``(txid, seq)`` order; and downstream every row is applied once.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections import Counter

import psycopg
from psycopg import sql

from kinbox.devstack.stack import Stack
from producer_outbox.lane_locks import LaneOwner
from tests.support.database import Conn
from tests.support.fault_run import Run
from tests.support.outbox import (
    as_produced,
    consume,
    count,
    enqueue_many,
    first_deliveries,
    migrate_outbox,
    relay_process,
    stop_relay,
)
from tests.support.scenario import scenario
from tests.support.waiting import wait_for

GROUPS = 2


@scenario(
    "12b", "outbox relay killed, two batches in flight", fault="relay SIGKILL, 2 batches in flight"
)
def test_relay_killed_with_both_lane_groups_in_flight(run: Run, stack: Stack) -> None:
    _scenario(run, stack, run.events)


def _publish_through_the_kill(
    run: Run, stack: Stack, db: Conn, items: list[tuple[str | None, int]], batch: int
) -> None:
    """Publish ``items`` with a relay that dies with two batches in flight; drain with two more."""
    nth = run.rng.randint(1, 3)
    backlog = 2 * len(items) // 3
    args = ["--batch-size", str(batch), "--lanes", "8", "--parallel", str(GROUPS)]
    relays: list[subprocess.Popen[bytes]] = []
    try:
        # Given a backlog over 11 keys in 8 lanes, two lane groups publishing
        # it, and a relay that SIGKILLs itself after Kafka acknowledged one
        # group's batch while the other's is open too
        enqueue_many(stack.database_url, run.schema, run.topic, items[:backlog])
        fail = {"KINBOX_FAILPOINTS": f"relay_after_publish_overlapped=kill@{nth}"}
        crashing = relay_process(stack, run.schema, *args, env=fail)
        relays.append(crashing)
        writer = threading.Thread(
            target=enqueue_many,
            args=(stack.database_url, run.schema, run.topic, items[backlog:]),
        )
        writer.start()
        # When it dies, and two relays take over while the writer goes on
        assert crashing.wait(60) == -signal.SIGKILL, "the failpoint never fired"
        relays += [relay_process(stack, run.schema, *args) for _ in range(2)]
        writer.join(60)
        # Then every committed row is marked sent
        wait_for(
            lambda: count(db, run.schema, "status = 'sent'") == len(items),
            timeout=90,
            what=f"{len(items)} outbox rows sent",
        )
        # and the relays stop cleanly (once registered: a relay that is still
        # starting up has no SIGTERM handler yet)
        registered = LaneOwner(db, run.schema, 8)
        wait_for(lambda: registered.relays() == 2, what="both relays registered")
        assert all(stop_relay(r) == 0 for r in relays[1:]), "a relay did not stop cleanly"
        print(f"[faults] scenario 12b: killed at overlapped pass {nth}")
    finally:
        for relay in relays:
            if relay.poll() is None:
                relay.kill()
                relay.wait(10)


def _scenario(run: Run, stack: Stack, events: int) -> None:
    batch = run.rng.choice([5, 10, 20])
    items: list[tuple[str | None, int]] = [(f"k{n % 11}", n) for n in range(events)]
    downstream = run.factory.start("downstream")
    with psycopg.connect(stack.database_url, autocommit=True) as db:
        migrate_outbox(db, run.schema)
        _publish_through_the_kill(run, stack, db, items, batch)
        rows = db.execute(
            sql.SQL("SELECT id::text, aggregateid FROM {}.outbox ORDER BY txid, seq").format(
                sql.Identifier(run.schema)
            )
        ).fetchall()
    promised: dict[str | None, list[str]] = {}
    for event_id, key in rows:
        promised.setdefault(key, []).append(event_id)
    received = consume(stack, run.topic, len(items), linger=1.0)
    copies = Counter(r.event_id for r in received)
    # and each one is in the topic; the batches in flight went out again at
    # most once more each: at most one batch per lane group
    assert set(copies) == {r[0] for r in rows}, "published ids differ from the outbox"
    duplicates = len(received) - len(copies)
    assert 1 <= duplicates <= GROUPS * batch, (
        f"{duplicates} duplicates, batch size {batch}, {GROUPS} lane groups"
    )
    assert max(copies.values()) == 2, "a row went out more than twice"
    # and every key's first deliveries are in (txid, seq) order
    firsts = first_deliveries(received)
    assert {key: [r.event_id for r in rs] for key, rs in firsts.items()} == promised
    print(f"[faults] scenario 12b: {len(items)} rows, batch {batch}, duplicates {duplicates}")
    run.produced = as_produced(run.topic, run.partitions, received)
    # And downstream, the worker applies every row once (suppressing the duplicates)
    run.wait_caught_up(downstream)
    assert downstream.stop() == 0, downstream.log_tail()
    outcome = run.finish()
    assert outcome.events == len(items) and outcome.applied_once == len(items), outcome
