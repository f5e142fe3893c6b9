"""Scenarios 18-19: a member whose transaction is still open when its partition has moved on.

18, a zombie: a member frozen (SIGSTOP) with a batch in flight, past the
session timeout, is expelled; the other member takes its partitions over
and claims the same ids, which waits for the frozen transaction. Thawed
(SIGCONT), the zombie commits its database work — the new owner then skips
those events — and gets no offset commit through: its generation is gone.

19, the claim race: a batch outlives the revoke wait, so the new owner
claims the same ids while the old owner's transaction is still open. Ending
``commit``: the old owner then COMMITs, and the new owner skips those
events. Endings ``terminate`` and ``sigkill``: the old owner's backend is
terminated (``pg_terminate_backend``) or the old owner SIGKILLed, its
transaction rolls back, and the new owner applies the events, once.

Both see the waiting in PostgreSQL itself (``pg_blocking_pids``: the new
owner's claim blocked by the old owner's backend), tell the members'
sessions apart by ``application_name``, and end with no session left waiting
or inside a transaction. Several partitions and slow handlers keep more than
one member, and more than one partition batch, busy at the moment of the
fault.
"""

from __future__ import annotations

import signal
import time

import psycopg
from psycopg import sql

from tests.support.database import (
    Backend,
    backends,
    stuck_backends,
    with_application_name,
)
from tests.support.fault_run import Run
from tests.support.launch import FAST_TIMINGS
from tests.support.scenario import scenario
from tests.support.waiting import wait_for
from tests.support.workers import Worker, read_deliveries

SESSION_TIMEOUT = FAST_TIMINGS["session_timeout"]
HOLD = r"still running after [\d.]+s: pausing"
OUTLIVED = r"revoke of .*: its batch in flight is still running after [\d.]+s"


def _effects_by(run: Run) -> dict[str, list[int]]:
    """Event id -> the pid of every worker that wrote an effect row for it."""
    with psycopg.connect(run.database_url, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT event_id, pid FROM {}.effects ORDER BY seq").format(
                sql.Identifier(run.schema)
            )
        ).fetchall()
    found: dict[str, list[int]] = {}
    for event_id, pid in rows:
        found.setdefault(event_id, []).append(int(pid))
    return found


def _session(run: Run, application: str) -> Backend | None:
    """The backend of ``application`` that has a transaction open, if one does."""
    found = [b for b in backends(run.database_url) if b.application == application]
    return next((b for b in found if b.in_transaction), None)


def _blocked_by(run: Run, waiter: str, holder: str) -> bool:
    """Whether a backend of ``waiter`` waits for a lock that a backend of ``holder`` holds."""
    sessions = backends(run.database_url)
    holders = {b.pid for b in sessions if b.application == holder}
    return any(
        b.waiting_for_lock and holders.intersection(b.blocked_by)
        for b in sessions
        if b.application == waiter
    )


def _assert_nothing_waits(run: Run) -> None:
    stuck = stuck_backends(run.database_url)
    assert not stuck, f"sessions left waiting or in a transaction: {stuck}"


def _freeze_inside_a_transaction(run: Run, worker: Worker, application: str) -> None:
    """SIGSTOP ``worker`` at a moment its backend has a transaction open (seeded retries)."""
    for _ in range(50):
        time.sleep(run.rng.uniform(0.0, 0.3))
        worker.signal(signal.SIGSTOP)
        if _session(run, application) is not None:
            return
        worker.signal(signal.SIGCONT)  # between two batches: try again a moment later
    raise AssertionError(f"{worker.name} never caught inside a transaction\n{worker.log_tail()}")


@scenario("18", "zombie member", fault="member SIGSTOPped past session", partitions=4)
def test_frozen_member_is_a_zombie_that_commits_nothing_through(run: Run) -> None:
    # Enough that the other member's own partitions still have work while the
    # zombie is frozen (lanes apply them side by side: 100 each were gone
    # before the takeover); the taken-over ones wait for the zombie's locks.
    run.produce(count=4 * run.events + 100, duplicates=run.rng.randint(0, 10))
    urls = {name: with_application_name(run.database_url, name) for name in ("zombie", "other")}
    env = {"FAULT_SLEEP": str(run.rng.choice([0.01, 0.02]))}
    batch = run.rng.choice([10, 20])
    with run.sampling(monotonic=True):
        # Given two members, both applying batches
        zombie = run.factory.start(
            "zombie", env=env, database_url=urls["zombie"], batch_max_messages=batch
        )
        other = run.factory.start(
            "other", env=env, database_url=urls["other"], batch_max_messages=batch
        )
        zombie.wait_assigned()
        other.wait_assigned()
        run.wait_handler_calls(run.rng.randint(40, 80))
        # When one is frozen with a transaction open, past the session timeout
        _freeze_inside_a_transaction(run, zombie, "zombie")
        frozen_at = time.monotonic()
        before = len(_effects_by(run))
        extra = run.rng.uniform(2, 4)
        blocked = False
        # (until the other member's claim of the same ids has been seen waiting
        # for the zombie's transaction: the takeover happened)
        while time.monotonic() < frozen_at + max(30.0, SESSION_TIMEOUT + 4):
            blocked = blocked or _blocked_by(run, "other", "zombie")
            if blocked and time.monotonic() > frozen_at + SESSION_TIMEOUT + extra:
                break
            time.sleep(0.1)
        progress = len(_effects_by(run)) - before
        zombie.signal(signal.SIGCONT)
        # Then the other member took the partitions over and waited for the zombie's claim
        assert blocked, "the other member's claim never waited for the zombie's transaction\n" + (
            other.log_tail()
        )
        assert progress > 0, "the other member made no progress while the zombie was frozen"
        # and both go on to the end; the zombie learns it was expelled
        run.wait_caught_up(zombie, other, timeout=120)
        zombie.wait_log(r"lost \[\(")
        assert zombie.stop() == 0, zombie.log_tail()
        assert other.stop() == 0, other.log_tail()
    print(f"[faults] scenario 18: {progress} events applied while the zombie was frozen")
    _assert_nothing_waits(run)
    run.finish()


@scenario(
    "19", "claim race, old owner {case}", fault="batch outlives revoke, then {case}",
    partitions=2, cases={e: {"ending": e} for e in ("commit", "terminate", "sigkill")},
)  # fmt: skip
def test_claim_race_while_the_old_owners_transaction_is_open(run: Run, ending: str) -> None:
    produced = run.produce(count=200)
    held = f"{run.group}-ev-0"  # partition 0, offset 0: the old owner's first batch there
    gate = run.log_dir / "gate"
    urls = {name: with_application_name(run.database_url, name) for name in ("old", "new")}
    # The range assignor orders static members by group.instance.id: with both
    # in the group, the new owner ("a-...") gets partition 0, the old ("b-...") 1.
    # A revoke wait of 2 s (shutdown_timeout) that the held batch outlives.
    kafka = {"partition.assignment.strategy": "range"}
    short_revoke = {"KINBOX_SHUTDOWN_TIMEOUT": "2"}
    batch = run.rng.choice([10, 20, 30])
    with run.sampling(monotonic=True):
        # Given the old owner, its batch on partition 0 held inside its transaction
        old = run.factory.start(
            "old", database_url=urls["old"], batch_max_messages=batch,
            kafka={**kafka, "group.instance.id": f"{run.group}-b-old"},
            env={**short_revoke, "FAULT_SLOW_IDS": held, "FAULT_SLOW_SECONDS": "90",
                 "FAULT_GATE": str(gate)},
        )  # fmt: skip
        old.wait_log(HOLD)
        wait_for(lambda: held in read_deliveries(run.log_dir).holds, 30, f"{held} held")
        assert _session(run, "old") is not None, "the old owner's transaction is not open"
        # When a new member joins, partition 0 moves to it, the revoke wait runs out
        new = run.factory.start(
            "new", database_url=urls["new"], batch_max_messages=batch,
            kafka={**kafka, "group.instance.id": f"{run.group}-a-new"}, env=short_revoke,
        )  # fmt: skip
        old.wait_log(OUTLIVED)
        # and the new owner claims the same ids while the old transaction is open
        wait_for(lambda: _blocked_by(run, "new", "old"), 60, "the new owner's claim to wait")
        old_batch = _ids_on(run, old, partition=0)
        assert held in old_batch
        # Then the old owner's transaction ends one way or the other
        if ending == "commit":
            gate.touch()
        elif ending == "terminate":
            holder = _session(run, "old")
            assert holder is not None
            with psycopg.connect(run.database_url, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(%s)", (holder.pid,))
            gate.touch()  # the held handler returns into a connection that is gone
        else:
            old.kill()
        members = (new,) if ending == "sigkill" else (new, old)
        run.wait_caught_up(*members, timeout=90)
        for member in members:
            assert member.stop() == 0, member.log_tail()
    effects = _effects_by(run)
    writers = {effects[i][0] for i in old_batch if i in effects}
    expected = old.pid if ending == "commit" else new.pid
    # The old owner's batch was applied once, by the old owner if it committed,
    # else by the new one
    assert writers == {expected}, (ending, writers, old.pid, new.pid)
    _assert_nothing_waits(run)
    # The drain speaks the same assignment protocol: the stopped static
    # members stay in the group until their session times out.
    outcome = run.finish(drain_kafka=kafka)
    if ending == "commit":
        assert outcome.duplicates_suppressed >= 1, outcome
    assert set(produced.ids) >= old_batch


def _ids_on(run: Run, worker: Worker, *, partition: int) -> set[str]:
    """The ids of ``partition`` that ``worker`` received (its one batch there, claimed)."""
    path = run.log_dir / f"deliveries-{worker.pid}.log"
    ids = set()
    for line in path.read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["d"] and int(parts[1]) == partition:
            ids.add(parts[3])
    return ids
