"""Scenarios 26a-26b: faults while several partition batches are in flight at once.

The runner applies partitions side by side, each batch in its own
transaction on its own connection, and commits offsets asynchronously as
batches end (:mod:`kinbox.consume.runner`). So a crash or a rebalance may
now find more than one batch in flight, and an offset commit on its way.
These scenarios hold batches of two partitions on purpose (``FAULT_SLOW_IDS``
with a gate, :mod:`tests.support.effect_app`) while a third keeps
committing, and then:

26a. SIGKILL the worker at the third partition's COMMIT (just before it, or
     just after it with its offset not committed), with the two held batches
     open on their own connections;
26b. start a second member, so a rebalance revokes partitions while held
     batches and the third partition's asynchronous commits are in flight,
     and release the held batches during the revoke.

Each ends with a final drain, and the invariants are checked in the
database (every event applied once, in offset order per partition) and on
the broker (committed offsets, sampled throughout, never ahead of the DB).
"""

from __future__ import annotations

import signal

from tests.support.fault_run import Run
from tests.support.holds import held_env, holding, wait_holding
from tests.support.invariants import effects_by_pid
from tests.support.scenario import scenario
from tests.support.workers import read_deliveries

HELD = (1, 2)
"""The partitions whose first batch is held; partition 0 flows."""


def _held_ids(run: Run) -> list[str]:
    """One event id per held partition, its earliest whose id occurs nowhere else."""
    assert run.produced is not None
    records = run.produced.records
    ids = list(records.values())
    out = []
    for partition in HELD:
        offsets = sorted(o for p, o in records if p == partition)
        out.append(
            next(
                records[(partition, o)] for o in offsets if ids.count(records[(partition, o)]) == 1
            )
        )
    return out


@scenario(
    "26a", "crash with batches in flight {case}", fault="SIGKILL at {case} COMMIT, 2 others open",
    cases={
        "before": {"point": "before_db_commit"},
        "after": {"point": "after_db_commit"},
    },
)  # fmt: skip
def test_sigkill_with_two_batches_in_flight(run: Run, point: str) -> None:
    # No duplicates: a repeat on partition 0 of an id a held batch has
    # claimed waits for that batch's transaction (the inbox's row lock), so
    # partition 0 would stop committing before the kill point (seed 540552125)
    run.produce()
    held = _held_ids(run)
    nth = run.rng.randint(3, 5)
    with run.sampling():
        # Given a worker whose batches on partitions 1 and 2 are held open,
        # each on its own connection, while partition 0 goes on committing
        victim = run.factory.start(
            # 10 ms an event: the held batches have begun long before the kill
            "victim", env=held_env(run, held, 0.01), failpoints=f"{point}=kill@{nth}",
            batch_max_messages=run.rng.choice([10, 20]),
        )  # fmt: skip
        # When it is SIGKILLed at one of partition 0's COMMITs
        assert victim.wait(60) == -signal.SIGKILL, victim.log_tail()
    # Then the held batches were in flight at the crash ...
    holding(run, held, victim.pid)
    # ... and a clean worker ends with every event applied once, in order
    outcome = run.finish()
    if point == "after_db_commit":
        # Committed in the database, its offset not yet: delivered again, suppressed.
        assert outcome.duplicates_suppressed >= 1, outcome


PROTOCOLS: dict[str, dict[str, str | None]] = {
    "cooperative": {},  # kinbox's default: cooperative-sticky
    "eager": {"partition.assignment.strategy": "range"},
}


@scenario(
    "26b", "rebalance, overlapping commits {case}", fault="join with 2 batches held, {case}",
    cases={protocol: {"protocol": protocol} for protocol in PROTOCOLS},
)  # fmt: skip
def test_rebalance_with_batches_in_flight_and_commits_on_their_way(run: Run, protocol: str) -> None:
    # 300 events a partition at 20 ms each: partition 0 still commits when the
    # second member joins, and each partition has work left when it moves
    run.produce(count=max(run.events, 900), duplicates=run.rng.randint(0, 10))
    held = _held_ids(run)
    kafka = PROTOCOLS[protocol]
    with run.sampling():
        # Given a member with batches held on partitions 1 and 2 while
        # partition 0 commits batch after batch, asynchronously
        first = run.factory.start("first", env=held_env(run, held, 0.02), kafka=kafka,
                                  batch_max_messages=10)  # fmt: skip
        wait_holding(run, held, first.pid)
        # When a second member joins, and the held batches end during the revoke
        joiner = run.factory.start("joiner", env=held_env(run, [], 0.02), kafka=kafka)
        first.wait_log(r"revoked \[\(")
        (run.log_dir / "gate").touch()
        # Then both members finish the stream
        run.wait_caught_up(first, joiner, timeout=60)
        assert first.stop() == 0, first.log_tail()
        assert joiner.stop() == 0, joiner.log_tail()
    shares = effects_by_pid(run.database_url, run.schema)
    assert shares.get(joiner.pid, 0) > 0, f"the joiner applied nothing: {shares}"
    # The revoke waited for the held batches and committed their offsets itself
    assert "will not be committed" not in first.log(), first.log_tail()
    holds = read_deliveries(run.log_dir).holds
    assert all(dict(holds[i]).keys() == {"begin", "end"} for i in held), holds
    run.finish()
