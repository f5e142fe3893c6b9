"""Scenario 12: the outbox relay SIGKILLed mid-batch, and two relays at once, end to end.

Real ``kinbox outbox relay`` processes (started with
:mod:`tests.support.outbox`) publish rows that a writer keeps committing; a
real ``kinbox worker`` consumes the topic meanwhile. The relay that is killed
between Kafka's ack and its COMMIT re-publishes that batch (and the other lane
group's batch in flight) after the restart, so the topic holds duplicates — at
most one batch per lane group — and the inbox must apply every committed outbox
row exactly once, in per-key order.

The offset sampler does not run here: which records exist is known only once
the relays are done, so invariant 2 is checked at the end (by the drain's
invariant check), not continuously.
"""

from __future__ import annotations

import signal
import subprocess
import threading
from collections import Counter

import psycopg
from psycopg import sql

from kinbox.devstack.stack import Stack
from producer_outbox.config import RelayConfig
from producer_outbox.lane_locks import LaneOwner
from tests.support.fault_run import Run
from tests.support.outbox import (
    as_produced,
    assert_key_order,
    consume,
    count,
    enqueue_many,
    migrate_outbox,
    relay_process,
    stop_relay,
)
from tests.support.scenario import scenario
from tests.support.waiting import wait_for


@scenario("12", "outbox relay killed", fault="relay SIGKILL mid-batch, 2 relays")
def test_relay_killed_mid_batch_and_two_relays_end_to_end(run: Run, stack: Stack) -> None:
    with psycopg.connect(stack.database_url, autocommit=True) as db:
        migrate_outbox(db, run.schema)
        batch = run.rng.choice([10, 25])
        nth = run.rng.randint(2, 4)
        items: list[tuple[str | None, int]] = [(f"k{n % 7}", n) for n in range(run.events)]
        half = len(items) // 2
        args = ["--batch-size", str(batch), "--lanes", "4"]
        relays: list[subprocess.Popen[bytes]] = []
        downstream = run.factory.start("downstream")
        try:
            # Given committed outbox rows and a relay that SIGKILLs itself
            # on its nth batch, after Kafka acked it, before its COMMIT
            # (alone, so it owns every lane and surely reaches its nth batch)
            enqueue_many(stack.database_url, run.schema, run.topic, items[:half])
            fail = {"KINBOX_FAILPOINTS": f"relay_after_publish=kill@{nth}"}
            crashing = relay_process(stack, run.schema, *args, env=fail)
            relays.append(crashing)
            writer = threading.Thread(
                target=enqueue_many,
                args=(stack.database_url, run.schema, run.topic, items[half:]),
            )
            writer.start()
            # When it dies, and is restarted next to a second relay, both
            # running at once while the writer goes on
            assert crashing.wait(60) == -signal.SIGKILL
            relays.append(relay_process(stack, run.schema, *args))
            relays.append(relay_process(stack, run.schema, *args))
            writer.join(60)
            # Then every committed row is marked sent
            total = len(items)
            wait_for(
                lambda: count(db, run.schema, "status = 'sent'") == total,
                timeout=60,
                what=f"{len(items)} outbox rows sent",
            )
            # (once both are registered: a relay still starting up has no SIGTERM
            # handler yet, and the other may have sent every row before it got there)
            owners = LaneOwner(db, run.schema, 4)
            wait_for(lambda: owners.relays() == 2, what="both restarted relays registered")
            assert all(stop_relay(r) == 0 for r in relays[1:])
        finally:
            for relay in relays:
                if relay.poll() is None:
                    relay.kill()
                    relay.wait(10)
        rows = db.execute(
            sql.SQL("SELECT id::text FROM {}.outbox").format(sql.Identifier(run.schema))
        ).fetchall()
    outbox_ids = {r[0] for r in rows}
    received = consume(stack, run.topic, len(items), linger=1.0)
    copies = Counter(r.event_id for r in received)
    assert set(copies) == outbox_ids, "published ids differ from the outbox rows"
    duplicates = len(received) - len(copies)
    # The killed batches went out twice: at least one duplicate, at most one
    # batch per lane group of the relay (each had at most one in flight).
    groups = RelayConfig("x").parallel
    assert 1 <= duplicates <= batch * groups, f"{duplicates} duplicates, batch size {batch}"
    assert_key_order(received)
    run.produced = as_produced(run.topic, run.partitions, received)
    # And downstream, the worker applies every row once (suppressing the duplicates)
    run.wait_caught_up(downstream)
    assert downstream.stop() == 0, downstream.log_tail()
    outcome = run.finish()
    assert outcome.events == len(items) and outcome.applied_once == len(items), outcome
