"""Scenario 17: concurrent writers of a few keys while relays are SIGKILLed and restarted.

A seeded scheduler drives several transactions on separate connections. Each
takes its transaction id at a random moment (early, with
``pg_current_xact_id()``, or at its first enqueue), enqueues rows of a few
keys interleaved with the others, and commits — or rolls back — in a random
order, so a key's txid order, seq order and commit order all differ. Two real
``kinbox outbox relay`` processes publish meanwhile: one SIGKILLs itself
between Kafka's ack and its COMMIT (a failpoint), the other is SIGKILLed from
outside at a seeded moment; both are restarted. A real ``kinbox worker``
consumes the topic for the scoreboard.

Then every committed row is in the topic, no rolled-back one is, and per key
the first delivery of each row comes in exactly the promised order,
``(txid, seq)``, read back from the outbox table.
"""

from __future__ import annotations

import itertools
import random
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg
from psycopg import sql

from kinbox.devstack.stack import Stack
from producer_outbox.lane_locks import LaneOwner
from producer_outbox.writer import enqueue
from tests.support.database import Conn
from tests.support.fault_run import Run
from tests.support.outbox import (
    as_produced,
    consume,
    count,
    first_deliveries,
    migrate_outbox,
    relay_process,
    stop_relay,
)
from tests.support.scenario import scenario
from tests.support.waiting import wait_for

KEYS = ("order-1", "order-2", "order-3")
SLOTS = 4
LANES = 4


@dataclass
class Writers:
    """Seeded interleaved writer transactions; counts what they committed and rolled back."""

    database_url: str
    schema: str
    topic: str
    rng: random.Random
    target: int
    committed: int = 0
    rolled_back: set[str] = field(default_factory=set)
    commit_order: list[str] = field(default_factory=list)
    error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def _run(self) -> None:
        conns = [psycopg.connect(self.database_url) for _ in range(SLOTS)]
        open_rows: list[list[str] | None] = [None] * SLOTS
        n = 0
        try:
            while self.committed < self.target:
                slot = self.rng.randrange(SLOTS)
                conn, rows = conns[slot], open_rows[slot]
                if rows is None:
                    if self.rng.random() < 0.5:
                        conn.execute("SELECT pg_current_xact_id()")  # its id, now
                    open_rows[slot] = []
                elif not rows or self.rng.random() < 0.6:
                    key = self.rng.choice(KEYS)
                    rows.append(str(enqueue(conn, self.topic, {"n": n}, key=key,
                                            schema=self.schema)))  # fmt: skip
                    n += 1
                else:
                    self._end(conn, rows, commit=self.rng.random() < 0.93)
                    open_rows[slot] = None
                time.sleep(self.rng.uniform(0, 0.004))
            for conn, rows in zip(conns, open_rows, strict=True):
                if rows is not None:
                    self._end(conn, rows, commit=True)
        finally:
            for conn in conns:
                conn.close()

    def _end(self, conn: psycopg.Connection[tuple[object, ...]], rows: list[str], *,
             commit: bool) -> None:  # fmt: skip
        if commit:
            conn.commit()
            self.committed += len(rows)
            self.commit_order += rows
        else:
            conn.rollback()
            self.rolled_back.update(rows)


def _inversions(order: list[str], rank: dict[str, int]) -> int:
    """Adjacent pairs of ``order`` that ``rank`` puts the other way round."""
    return sum(rank[a] > rank[b] for a, b in itertools.pairwise(order))


@scenario(
    "17", "outbox concurrent writers of one key", fault="interleaved writers, relays SIGKILLed"
)
def test_concurrent_writers_of_few_keys_with_relays_killed(run: Run, stack: Stack) -> None:
    _scenario(run, stack, run.events)


def _publish_while_killing_relays(run: Run, stack: Stack, db: Conn, writers: Writers) -> None:
    """Run the writers beside two relays, kill and restart relays, until every row is sent."""
    args = ["--batch-size", str(run.rng.choice([5, 20])), "--lanes", str(LANES)]
    kill_at = int(writers.target * run.rng.uniform(0.2, 0.6))
    fail = {"KINBOX_FAILPOINTS": f"relay_after_publish=kill@{run.rng.randint(2, 6)}"}
    deadline = time.monotonic() + 180
    started: list[subprocess.Popen[bytes]] = []
    try:
        # Given two relays (one to die between ack and COMMIT) and the writers
        live = [relay_process(stack, run.schema, *args, env=fail),
                relay_process(stack, run.schema, *args)]  # fmt: skip
        started += live
        thread = threading.Thread(target=writers.run)
        thread.start()
        # When the other relay is SIGKILLed mid-stream,
        wait_for(lambda: writers.committed >= kill_at or not thread.is_alive(),
                 timeout=120, what=f"{kill_at} rows committed")  # fmt: skip
        live[1].kill()
        # and every dead relay is restarted until the writers are done and every
        # committed row is marked sent
        while thread.is_alive() or count(db, run.schema, "status = 'sent'") < count(db, run.schema):
            for slot, relay in enumerate(live):
                if relay.poll() is not None:
                    live[slot] = relay_process(stack, run.schema, *args)
                    started.append(live[slot])
            thread.join(0.2)
            assert time.monotonic() < deadline, "rows still unsent after 180s"
        assert writers.error is None, writers.error
        # Then the relays stop cleanly (once registered: a relay that is still
        # starting up has no SIGTERM handler yet)
        relays = LaneOwner(db, run.schema, LANES)
        wait_for(lambda: relays.relays() == len(live), what="restarted relays registered")
        for relay in live:
            assert stop_relay(relay) == 0, "relay did not stop cleanly"
    finally:
        for relay in started:
            if relay.poll() is None:
                relay.kill()


def _scenario(run: Run, stack: Stack, events: int) -> None:
    writers = Writers(stack.database_url, run.schema, run.topic,
                      random.Random(run.rng.random()), events)  # fmt: skip
    downstream = run.factory.start("downstream")
    with psycopg.connect(stack.database_url, autocommit=True) as db:
        migrate_outbox(db, run.schema)
        _publish_while_killing_relays(run, stack, db, writers)
        rows = db.execute(
            sql.SQL("SELECT id::text, aggregateid FROM {}.outbox ORDER BY txid, seq").format(
                sql.Identifier(run.schema)
            )
        ).fetchall()
        seqs = db.execute(
            sql.SQL("SELECT id::text FROM {}.outbox ORDER BY seq").format(
                sql.Identifier(run.schema)
            )
        ).fetchall()
    promised: dict[str | None, list[str]] = {}
    for event_id, key in rows:
        promised.setdefault(key, []).append(event_id)
    received = consume(stack, run.topic, len(rows), linger=1.0)
    copies = Counter(r.event_id for r in received)
    # Nothing lost, nothing rolled back published, and each key in (txid, seq) order
    assert set(copies) == {r[0] for r in rows}, "published ids differ from committed rows"
    assert not writers.rolled_back & set(copies), "a rolled-back row was published"
    firsts = first_deliveries(received)
    assert {key: [r.event_id for r in rs] for key, rs in firsts.items()} == promised
    # The run really interleaved: seq order and commit order disagree with it
    rank = {event_id: i for i, (event_id, _key) in enumerate(rows)}
    by_seq = [r[0] for r in seqs]
    print(
        f"[faults] scenario 17: {len(rows)} rows, {len(writers.rolled_back)} rolled back, "
        f"seq-order inversions {_inversions(by_seq, rank)}, commit-order inversions "
        f"{_inversions(writers.commit_order, rank)}, duplicates {len(received) - len(copies)}"
    )
    assert _inversions(by_seq, rank) > 0, "the writers never interleaved"
    run.produced = as_produced(run.topic, run.partitions, received)
    # And downstream, the worker applies every row once
    run.wait_caught_up(downstream)
    assert downstream.stop() == 0, downstream.log_tail()
    outcome = run.finish()
    assert outcome.events == len(rows) and outcome.applied_once == len(rows), outcome
