"""Scenario 24: the chaos loop — everything that can go wrong, at seeded random moments.

For a fixed time (quick mode 45 s; long mode 300 s; ``KINBOX_CHAOS_SECONDS``
sets it) a writer commits outbox rows of a dozen keys, relays publish them
and workers apply them, while at random seeded moments members join, leave
(SIGTERM), are SIGKILLed, are frozen (SIGSTOP, sometimes past the session
timeout) and thawed, a relay is SIGKILLed and replaced, and PostgreSQL
restarts once (``-m immediate``) — confluent's parallel-consumer "chaos
monkey" and Apache Kafka's bounce tests. Then the writers stop, the relays
drain the outbox, a clean worker drains the topic, and the checker reports
lost, applied twice and out of order per key: all 0. Every action taken is
printed with the round's seed, so a failing round replays alone.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg
import pytest
from psycopg import sql

from kinbox.devstack.postgres import PostgresServer
from kinbox.devstack.stack import Stack
from tests.support.fault_run import Run
from tests.support.launch import FAST_TIMINGS
from tests.support.outbox import (
    RowWriter,
    as_produced,
    consume,
    migrate_outbox,
    relay_process,
    wait_all_sent,
)
from tests.support.scenario import long_mode, scenario
from tests.support.workers import Worker

SECONDS_ENV = "KINBOX_CHAOS_SECONDS"
KEYS = tuple(f"key-{n}" for n in range(12))
MAX_MEMBERS = 4
SESSION_TIMEOUT = FAST_TIMINGS["session_timeout"]


def chaos_seconds() -> float:
    """How long the chaos lasts: ``KINBOX_CHAOS_SECONDS``, else 45 s quick, 300 s long."""
    return float(os.environ.get(SECONDS_ENV) or (300 if long_mode() else 45))


@pytest.fixture
def fault_database_url(own_postgres: PostgresServer) -> str:
    """Every round of this module runs on a server of its own, which the loop restarts."""
    return own_postgres.url


@dataclass
class Chaos:
    """The members and relays the loop plays with, and what it did to them."""

    run: Run
    stack: Stack
    postgres: PostgresServer
    env: dict[str, str]
    members: list[Worker] = field(default_factory=list)
    frozen: dict[int, float] = field(default_factory=dict)
    """pid -> when to thaw it."""
    relays: list[subprocess.Popen[bytes]] = field(default_factory=list)
    started_relays: list[subprocess.Popen[bytes]] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    joined: int = 0

    def alive(self) -> list[Worker]:
        return [m for m in self.members if m.proc.poll() is None]

    def awake(self) -> list[Worker]:
        return [m for m in self.alive() if m.pid not in self.frozen]

    def join(self) -> None:
        if len(self.alive()) >= MAX_MEMBERS:
            return
        self.joined += 1
        batch = self.run.rng.choice([10, 30])
        member = self.run.factory.start(
            f"member-{self.joined}", env=self.env, batch_max_messages=batch
        )
        self.members.append(member)
        self.say(f"join {member.name}")

    def leave(self) -> None:
        self._to_some(signal.SIGTERM, "leave")

    def kill(self) -> None:
        self._to_some(signal.SIGKILL, "SIGKILL")

    def freeze(self) -> None:
        awake = self.awake()
        if len(awake) < 2:  # keep one member awake
            return
        member = self.run.rng.choice(awake)
        seconds = self.run.rng.choice([self.run.rng.uniform(0.5, 3), SESSION_TIMEOUT + 3])
        member.signal(signal.SIGSTOP)
        self.frozen[member.pid] = time.monotonic() + seconds
        self.say(f"SIGSTOP {member.name} for {seconds:.1f}s")

    def thaw_due(self, everything: bool = False) -> None:
        now = time.monotonic()
        for member in self.members:
            until = self.frozen.get(member.pid)
            if until is not None and (everything or until <= now):
                member.signal(signal.SIGCONT)
                del self.frozen[member.pid]
                self.say(f"SIGCONT {member.name}")

    def relay(self) -> None:
        victim = self.run.rng.randrange(len(self.relays))
        self.relays[victim].kill()
        self.relays[victim].wait(10)
        self.relays[victim] = self._start_relay()
        self.say(f"relay {victim} SIGKILLed and replaced")

    def restart_postgres(self) -> None:
        self.say("PostgreSQL restart -m immediate")
        self.postgres.restart(immediate=True)

    def keep_one(self) -> None:
        if not self.awake():
            self.join()

    def _start_relay(self) -> subprocess.Popen[bytes]:
        relay = relay_process(self.stack, self.run.schema, "--batch-size",
                              str(self.run.rng.choice([5, 20])), "--lanes", "8")  # fmt: skip
        self.started_relays.append(relay)
        return relay

    def start_relays(self, count: int) -> None:
        self.relays = [self._start_relay() for _ in range(count)]

    def _to_some(self, signum: int, what: str) -> None:
        awake = self.awake()
        if len(awake) < 2:
            return
        member = self.run.rng.choice(awake)
        member.signal(signum)
        self.say(f"{what} {member.name}")

    def say(self, what: str) -> None:
        self.done.append(what)
        print(f"[faults] chaos +{len(self.done)}: {what}")


Plan = list[tuple[float, Callable[[], None]]]


def _schedule(rng: random.Random, seconds: float, chaos: Chaos) -> Plan:
    """Seeded moments and what happens then: about one thing every three seconds."""
    actions: list[Callable[[], None]] = [chaos.join, chaos.leave, chaos.kill, chaos.freeze,
                                         chaos.freeze, chaos.relay]  # fmt: skip
    plan = [(rng.uniform(1, seconds), rng.choice(actions)) for _ in range(int(seconds / 3))]
    plan.append((rng.uniform(0.3, 0.7) * seconds, chaos.restart_postgres))
    return sorted(plan, key=lambda item: item[0])


def _key_order(run: Run) -> list[str]:
    """Per key: the events' first effects in the order the outbox promised, ``(txid, seq)``."""
    with psycopg.connect(run.database_url, autocommit=True) as db:
        schema = sql.Identifier(run.schema)
        promised = db.execute(sql.SQL(
            "SELECT id::text, aggregateid FROM {}.outbox ORDER BY txid, seq").format(schema)
        ).fetchall()  # fmt: skip
        applied = db.execute(sql.SQL(
            "SELECT event_id FROM {}.effects GROUP BY event_id ORDER BY min(seq)").format(schema)
        ).fetchall()  # fmt: skip
    key_of = {row_id: key for row_id, key in promised}
    wanted: dict[str, list[str]] = {}
    for row_id, key in promised:
        wanted.setdefault(key, []).append(row_id)
    got: dict[str, list[str]] = {}
    for (event_id,) in applied:
        got.setdefault(key_of.get(event_id, "?"), []).append(event_id)
    return [f"key {key}: applied out of the outbox's order"
            for key in wanted if got.get(key) != wanted[key]]  # fmt: skip


@scenario("24", "chaos loop", fault="members, relays, PG at random", partitions=6)
def test_chaos_loop(run: Run, own_postgres: PostgresServer) -> None:
    seconds = chaos_seconds()
    stack = Stack(run.bootstrap, run.database_url, None, None)
    with psycopg.connect(run.database_url, autocommit=True) as db:
        migrate_outbox(db, run.schema)
    env = {"FAULT_SLEEP": str(run.rng.choice([0.002, 0.005]))}
    chaos = Chaos(run, stack, own_postgres, env)
    writer = RowWriter(run.database_url, run.schema, run.topic, KEYS,
                       random.Random(run.rng.random()))  # fmt: skip
    thread = threading.Thread(target=writer.run, daemon=True)
    plan = _schedule(run.rng, seconds, chaos)
    try:
        with run.sampling(monotonic=True):
            # Given members, relays and a writer
            chaos.join()
            chaos.join()
            chaos.start_relays(2)
            thread.start()
            began = time.monotonic()
            # When things go wrong at seeded moments, for `seconds`
            for at, action in plan:
                while time.monotonic() < began + at:
                    chaos.thaw_due()
                    time.sleep(0.05)
                action()
                chaos.keep_one()
            while time.monotonic() < began + seconds:
                chaos.thaw_due()
                time.sleep(0.05)
            chaos.thaw_due(everything=True)
            # Then, once the writer stopped, the relays publish every row
            writer.stop.set()
            thread.join(30)
            total = wait_all_sent(run.database_url, run.schema)
            for relay in chaos.relays:
                relay.send_signal(signal.SIGTERM)
                relay.wait(30)
            received = consume(stack, run.topic, total, linger=1.0)
            run.produced = as_produced(run.topic, run.partitions, received)
            # and the members still there catch up
            survivors = chaos.alive()
            run.wait_caught_up(*survivors, timeout=120)
            for member in survivors:
                assert member.stop() == 0, member.log_tail()
    finally:
        writer.stop.set()
        chaos.thaw_due(everything=True)
        for relay in chaos.started_relays:
            if relay.poll() is None:
                relay.kill()
            relay.wait(10)
    outcome = run.finish(drain_timeout=120)
    disorder = _key_order(run)
    print(f"[faults] scenario 24 chaos: {seconds:.0f}s, {len(chaos.done)} actions, "
          f"{writer.commits} rows committed ({writer.outages} writer outages), "
          f"{len(received) - outcome.events} records published twice; lost "
          f"{len(outcome.lost)}, applied twice {len(outcome.applied_twice)}, out of order per "
          f"key {len(disorder)}")  # fmt: skip
    assert not disorder, disorder[:5]
    assert outcome.events == total
