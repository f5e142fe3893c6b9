"""Scenarios 1-3: the worker process dies or is stopped in the middle of a batch.

Real ``kinbox worker`` subprocesses; the crash is a real SIGKILL from a
failpoint (``KINBOX_FAILPOINTS``), the stop a real SIGTERM. After each, a clean
worker drains the topic and the invariants are checked in the database and on
the broker.
"""

from __future__ import annotations

import signal

from tests.support.fault_run import Run
from tests.support.scenario import scenario
from tests.support.workers import read_deliveries


@scenario("1", "worker killed before commit", fault="SIGKILL before DB COMMIT")
def test_sigkill_before_db_commit(run: Run) -> None:
    nth = run.rng.randint(1, 3)
    batch = run.rng.choice([5, 20, 50])
    run.produce(duplicates=run.rng.randint(0, 10))
    with run.sampling():
        # Given a worker that SIGKILLs itself with the nth batch transaction still open
        victim = run.factory.start(
            "victim", failpoints=f"before_db_commit=kill@{nth}", batch_max_messages=batch
        )
        # When it reaches the failpoint
        assert victim.wait(60) == -signal.SIGKILL, victim.log_tail()
    # Then a clean worker ends with every event applied exactly once
    run.finish()


@scenario("2", "worker killed after commit", fault="SIGKILL after COMMIT, pre-offset")
def test_sigkill_after_db_commit_before_offset_commit(run: Run) -> None:
    nth = run.rng.randint(1, 3)
    batch = run.rng.choice([5, 20, 50])
    run.produce(duplicates=run.rng.randint(0, 10))
    with run.sampling():
        victim = run.factory.start(
            "victim", failpoints=f"after_db_commit=kill@{nth}", batch_max_messages=batch
        )
        assert victim.wait(60) == -signal.SIGKILL, victim.log_tail()
    outcome = run.finish()
    # The batch committed in the database had no offset committed, so
    # the drain got it again: the inbox must have suppressed it.
    assert outcome.duplicates_suppressed >= 1, outcome


@scenario("3", "worker stopped mid-batch", fault="SIGTERM mid-batch")
def test_sigterm_mid_batch_finishes_the_batch_without_redelivery(run: Run) -> None:
    produced = run.produce()
    after = run.rng.randint(10, len(produced.records) // 2)
    with run.sampling():
        # Given a worker whose handler takes 10 ms per event (50-event batches)
        worker = run.factory.start("stopped", env={"FAULT_SLEEP": "0.01"})
        run.wait_handler_calls(after)
        # When SIGTERM arrives while a handler runs
        worker.signal(signal.SIGTERM)
        # Then it finishes the batch, commits DB and offsets, and exits 0
        assert worker.wait(30) == 0, worker.log_tail()
    run.finish()
    # ... so nothing it received was received again by the next worker.
    redelivered = read_deliveries(run.log_dir).redelivered
    assert not redelivered, f"redelivered after a clean stop: {redelivered}"
