"""Scenario 28: a worker stops, for any reason, while one of its batches never ends.

Whatever stops a ``kinbox worker`` — a signal, its consumer fenced (a fatal
client error), ``--missing-id fail``, a middleware hook that raises, a
handler that calls ``sys.exit()`` (sync, or inside an async handler's
coroutine), the event loop of async handlers dying, a signal while the
database is unreachable, or a signal while the stop then blocks in a C call
that holds the GIL (so no Python thread runs, the bound's timer included) —
it must end within ``shutdown_timeout`` with the status that says why, even
with a batch in flight that would run for ten minutes more: it may wait for
that batch until the bound, and must not commit its offsets. That batch's
transaction is open on the server, with the event ids it claimed; the
process's exit closes the connection and PostgreSQL rolls it back, so nothing
of it survives, and a clean worker then applies every event exactly once.

Scenario 28b: a member SIGTERMed while the group rebalances around one that
was SIGKILLed and is still a member (its session has not timed out), under
each assignment protocol. Its stop must be graceful all the same (exit 0,
well within its bound): it leaves the group inside its polls, so closing
the client has nothing left to revoke (:mod:`kinbox.kafka.consumer`).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from kinbox.ops.exits import (
    EXIT_BAD_INPUT,
    EXIT_CRASH,
    EXIT_FATAL,
    EXIT_HANDLER_EXIT,
    EXIT_INTERRUPTED,
)
from tests.support.database import with_application_name, writing
from tests.support.fault_run import Run
from tests.support.faultproxy import FaultProxy
from tests.support.invariants import effect_counts, processed
from tests.support.launch import PROTOCOLS
from tests.support.records import Headers, committed, write_records
from tests.support.scenario import scenario
from tests.support.waiting import wait_for
from tests.support.workers import FAST_ENV, Worker, read_deliveries

SHUTDOWN_TIMEOUT = 4
HELD_FOR = 600
"""Seconds the stuck event's handler would hold its batch: far past any bound here."""

STOPS: dict[str, dict[str, object]] = {
    "signal": {"stop": "signal", "handler": "sync", "status": EXIT_INTERRUPTED},
    "fenced": {"stop": "fenced", "handler": "sync", "status": EXIT_FATAL},
    "missing-id": {"stop": "missing-id", "handler": "sync", "status": EXIT_BAD_INPUT},
    "middleware": {"stop": "middleware", "handler": "sync", "status": EXIT_CRASH},
    "sys-exit": {"stop": "sys-exit", "handler": "sync", "status": EXIT_HANDLER_EXIT},
    "async-sys-exit": {"stop": "sys-exit", "handler": "async", "status": EXIT_HANDLER_EXIT},
    "async-loop-dies": {"stop": "loop-dies", "handler": "async", "status": EXIT_CRASH},
    "database-lost": {"stop": "database-lost", "handler": "sync", "status": EXIT_INTERRUPTED},
    "gil-held": {"stop": "gil-held", "handler": "sync", "status": EXIT_INTERRUPTED},
}

SAYS = {
    "signal": "SIGTERM: finishing the batch in hand",
    "fenced": "the Kafka consumer failed fatally",
    "missing-id": "missing_id=fail",
    "middleware": "injected: a middleware's before_batch is broken",
    "sys-exit": "raised SystemExit: 3: stopping the worker",
    "loop-dies": "the event loop of async handlers (kinbox-async-handlers) died: SystemExit: 3",
    "database-lost": "SIGTERM: finishing the batch in hand",
    # No Python runs at the bound: faulthandler's dump of every thread says where it stuck.
    "gil-held": "most recent call first",
}
"""What the worker's log must say, by stop, about why it stopped."""


@scenario(
    "28", "worker stopped with a batch stuck ({case})", fault="{case} stops it, a batch hangs",
    partitions=2, cases=STOPS,
)  # fmt: skip
def test_a_stop_never_waits_for_a_stuck_batch_past_its_bound(
    run: Run, stop: str, handler: str, status: int
) -> None:
    run.factory.handler = handler
    produced = run.produce()
    stuck = f"{run.group}-ev-{2 * run.rng.randint(3, 20)}"  # on partition 0
    trigger = f"{run.group}-trigger"  # on partition 1, produced once the batch hangs
    name = f"victim-{run.group}"
    env = {
        "KINBOX_SHUTDOWN_TIMEOUT": str(SHUTDOWN_TIMEOUT),
        "FAULT_SLOW_IDS": stuck,
        "FAULT_SLOW_SECONDS": str(HELD_FOR),
        "FAULT_EXIT_IDS": trigger if stop == "sys-exit" else "",
        "FAULT_HOOK_FAIL_IDS": trigger if stop == "middleware" else "",
        "FAULT_KILL_LOOP_IDS": trigger if stop == "loop-dies" else "",
        "FAULT_STOP_HOLDS_GIL": "1" if stop == "gil-held" else "",
    }
    static = {"group.instance.id": f"{run.group}-member"} if stop == "fenced" else {}
    args = ["--missing-id", "fail"] if stop == "missing-id" else []
    gate = run.log_dir / "gate"
    if stop == "database-lost":
        env["FAULT_GATE"] = str(gate)
    with FaultProxy(_port(run.database_url)) as proxy, run.sampling():
        url = with_application_name(run.database_url, name)
        if stop == "database-lost":
            url = url.replace(f":{_port(run.database_url)}/", f":{proxy.port}/")
        # Given a worker whose batch of partition 0 hangs in its handler, its
        # transaction open on the server with the ids it claimed
        victim = run.factory.start(
            "victim", env=env, args=args, kafka=static, database_url=url, batch_max_messages=20
        )
        wait_for(lambda: stuck in read_deliveries(run.log_dir).holds, 60, f"{stuck} held")
        wait_for(lambda: writing(run.database_url, name), 30, "the held batch's open transaction")
        # When something stops the worker
        successor = _stop(run, stop, victim, stuck, trigger, proxy, gate, static)
        # Then it exits within its bound (the batch would hang for ten
        # minutes), with the status that says why
        got = victim.wait(60)
        assert got == status, f"exit status {got}, not {status}\n{victim.log_tail(60)}"
        log = victim.log()
        assert SAYS[stop] in log, victim.log_tail(60)
        if stop != "loop-dies":  # there, the held call dies with the loop it waits on
            assert "is still running after" in log and "beyond the shutdown timeout" in log, (
                victim.log_tail(60)
            )
        # and the batch it left was rolled back as its connection closed:
        # nothing of it is recorded, its offset never committed
        proxy.cut()  # a blackholed connection learns of the close only now
        wait_for(lambda: not writing(run.database_url, name), 30, "the transaction to end")
        if successor is None:  # else it may have applied the event since
            stuck_at = next(place for place, i in produced.records.items() if i == stuck)
            offsets = committed(run.bootstrap, run.group, run.topic, run.partitions)
            assert offsets.get(0, 0) <= stuck_at[1], (offsets, stuck_at)
            assert stuck not in processed(run.database_url, run.schema, run.group)
            assert effect_counts(run.database_url, run.schema)[stuck] == 0
        else:
            run.wait_caught_up(successor)
            assert successor.stop() == 0, successor.log_tail()
    # And a clean worker applies every event exactly once
    run.finish()


def _stop(
    run: Run, stop: str, victim: Worker, stuck: str, trigger: str, proxy: FaultProxy,
    gate: Path, static: dict[str, str],
) -> Worker | None:  # fmt: skip
    """Stop ``victim`` the way ``stop`` says; return a worker that took over, if one did."""
    assert run.produced is not None
    if stop == "database-lost":
        # The held event goes on to its statements, which the server never gets
        proxy.set_blackhole()
        gate.touch()
        wait_for(
            lambda: any(mark == "end" for mark, _ in read_deliveries(run.log_dir).holds[stuck]),
            30, "the held event to go on",
        )  # fmt: skip
    if stop in ("signal", "database-lost", "gil-held"):
        victim.signal(signal.SIGTERM)
        return None
    if stop == "fenced":
        # A second member with the same group.instance.id fences the first
        return run.factory.start("successor", kafka=static, batch_max_messages=20)
    if stop == "missing-id":
        written = write_records(run.bootstrap, run.topic, [(1, [], None)])
        run.expect_dead = frozenset(written.values())  # the drain dead-letters it
    else:
        headers: Headers = [("event-id", trigger.encode())]
        written = write_records(run.bootstrap, run.topic, [(1, headers, trigger)])
    run.produced.records.update(written)
    return None


def _port(database_url: str) -> int:
    return int(database_url.rsplit(":", 1)[1].split("/", 1)[0])


@scenario(
    "28b", "member stopped mid-rebalance ({case})", fault="SIGKILL one, SIGTERM one, {case}",
    partitions=6, cases={protocol: {"protocol": protocol} for protocol in PROTOCOLS},
)  # fmt: skip
def test_a_member_stopped_while_the_group_waits_for_a_dead_one_stops_cleanly(
    run: Run, protocol: str
) -> None:
    run.produce(count=3000)
    kafka = PROTOCOLS[protocol]
    env = {"FAULT_SLEEP": "0.01"}  # the stream lasts through every change below
    with run.sampling():
        # Given two members, and a third that joins them
        first = run.factory.start("first", env=env, kafka=kafka, batch_max_messages=20)
        doomed = run.factory.start("doomed", env=env, kafka=kafka, batch_max_messages=20)
        first.wait_assigned()
        doomed.wait_assigned()
        third = run.factory.start("third", env=env, kafka=kafka)
        third.wait_assigned()
        # When one is SIGKILLed (a member still, until its session times out)
        doomed.kill()
        time.sleep(run.rng.uniform(0.2, 3.0))
        # and another is SIGTERMed while the group waits for the dead one
        first.signal(signal.SIGTERM)
        # Then it stops as asked, within its bound
        status = first.wait(float(FAST_ENV["KINBOX_SHUTDOWN_TIMEOUT"]) + 30)
        assert status == 0, f"exit status {status}\n{first.log_tail(60)}"
        assert "closing the consumer revokes" not in first.log(), first.log_tail(60)
        # and the one left goes on to the end
        run.wait_caught_up(third)
        assert third.stop() == 0, third.log_tail()
    # And every event is applied exactly once, no offset ahead of the database
    run.finish()
