"""Scenarios 29a-c: key order with many keys in flight at once, then a crash, a rebalance, failures.

The workers run the fault app's handler in key order
(``FAULT_KEY_CONCURRENCY``, :mod:`tests.support.effect_app`): each partition
batch is applied a unit per key, up to eight at once, each in its own
transaction. The records are keyed over a few keys, so a batch holds several
units and a slow handler keeps them in flight together. Whatever happens to
them, the finish checks that every event was applied exactly once, that each
key's effects are in offset order within its partition, and that the
committed offsets never passed an unsettled record (sampled throughout).
"""

from __future__ import annotations

import signal

from tests.support.fault_run import Run
from tests.support.invariants import order_violations
from tests.support.scenario import scenario
from tests.support.workers import HANDLERS

KEYS = 12
"""Keys the records are spread over: several units in every batch."""
CONCURRENCY = 8
"""Units a worker applies at once."""


def _keyed(run: Run) -> None:
    run.factory.concurrency = CONCURRENCY
    run.produce(duplicates=run.rng.randint(0, 10), keys=KEYS)


def _keys_ran_side_by_side(run: Run) -> None:
    """Some partition's effects are out of offset order: its keys really overlapped."""
    across = order_violations(run.database_url, run.schema)
    assert across, "every partition's effects are in offset order: no two keys overlapped"


@scenario(
    "29a", "key order: worker killed with units in flight ({case})",
    fault="SIGKILL {case}, 8 keys in flight",
    cases={
        "before-commit": {"point": "before_db_commit"},
        "after-commit": {"point": "after_db_commit"},
    },
)  # fmt: skip
def test_key_order_crash_with_units_in_flight(run: Run, point: str) -> None:
    _keyed(run)
    nth = run.rng.randint(4, 12)
    with run.sampling():
        # Given a worker applying up to eight keys at once, each unit slow
        victim = run.factory.start(
            "victim", failpoints=f"{point}=kill@{nth}", env={"FAULT_SLEEP": "0.01"},
            batch_max_messages=run.rng.choice([20, 50]),
        )  # fmt: skip
        # When it dies at one unit's COMMIT while the others are open
        assert victim.wait(60) == -signal.SIGKILL, victim.log_tail()
    # Then a clean worker ends with every event applied once, each key in order
    run.finish()
    _keys_ran_side_by_side(run)


@scenario(
    "29b", "key order: member joins with units in flight ({case})",
    fault="rebalance, 8 keys in flight", cases=HANDLERS,
)  # fmt: skip
def test_key_order_rebalance_with_units_in_flight(run: Run, handler: str) -> None:
    run.factory.handler = handler
    _keyed(run)
    env = {"FAULT_SLEEP": "0.01"}
    with run.sampling(monotonic=True):
        # Given a member applying eight keys at once
        first = run.factory.start("first", env=env)
        run.wait_handler_calls(40)
        # When a second member joins (the first's units in flight are revoked)
        joiner = run.factory.start("joiner", env=env)
        first.wait_log(r"revoked \[\(")
        # Then the two share the partitions and catch up, riding it out
        run.wait_caught_up(first, joiner)
        assert first.stop() == 0, first.log_tail()
        assert joiner.stop() == 0, joiner.log_tail()
    run.finish()
    _keys_ran_side_by_side(run)


@scenario(
    "29c", "key order: failing keys", fault="some keys' handlers fail twice, others go on",
)  # fmt: skip
def test_key_order_failing_keys_hold_their_partition_at_the_watermark(run: Run) -> None:
    _keyed(run)
    # Given a handler that fails twice on every 9th event, whichever its key
    env = {"FAULT_SLEEP": "0.002", "FAULT_FAIL_TIMES": "2", "FAULT_FAIL_EVERY": "9"}
    with run.sampling(monotonic=True):
        worker = run.factory.start("worker", env=env)
        # When it works through them (the other keys of a batch commit past a
        # failing one; the partition rewinds to it and meets them again)
        run.wait_caught_up(worker)
        assert worker.stop() == 0, worker.log_tail()
    # Then nothing settled twice or was lost, and each key kept its order
    outcome = run.finish()
    assert outcome.duplicates_suppressed >= 1, outcome
