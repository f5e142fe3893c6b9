"""Scenario 25: a bad deploy, the handler failing for every event, and the circuit breaker.

Without a breaker the worker would give every event its tries and
dead-letter the whole topic, partition after partition. With it
(:mod:`kinbox.consume.breaker`) the worker pauses every partition after a
few events failed in a row, stays in the group, lets one event through now
and then, and goes on by itself once the handler works again ("the fix is
deployed": a flag file the test app reads). Then every event not given up
is applied exactly once, and ``kinbox dlq replay`` applies the few dead
letters, once each.
"""

from __future__ import annotations

import time

from click.testing import CliRunner

from kinbox.cli.main import main
from tests.support.fault_run import Run
from tests.support.invariants import effect_counts, processed
from tests.support.records import committed, log_ends
from tests.support.scenario import scenario
from tests.support.waiting import wait_for

FAILURES = 5
PAUSE = 3.0
OPEN = f"circuit breaker open: the handler failed for {FAILURES} events in a row"


def _dead(run: Run) -> set[str]:
    return {i for i, s in processed(run.database_url, run.schema, run.group).items()
            if s == "dead_lettered"}  # fmt: skip


@scenario("25", "every event fails (breaker)", fault="bad deploy, then fixed", partitions=4)
def test_a_bad_deploy_trips_the_breaker_and_drains_once_fixed(run: Run) -> None:
    produced = run.produce(duplicates=run.rng.randint(0, 10))
    fixed = run.log_dir / "fixed"
    args = ["--breaker-failures", str(FAILURES), "--breaker-pause", str(PAUSE),
            "--max-attempts", str(run.rng.choice([2, 3]))]  # fmt: skip
    with run.sampling(monotonic=True):
        # Given a worker whose handler fails for every event
        worker = run.factory.start("bad-deploy", env={"FAULT_BROKEN_UNLESS": str(fixed)}, args=args)
        # Then after a few events the breaker opens and says why
        worker.wait_log(OPEN)
        opened_calls, opened_dead = run.handler_calls(), len(_dead(run))
        window = run.rng.uniform(2.5 * PAUSE, 3.5 * PAUSE)
        time.sleep(window)
        # and meanwhile it tries one event per pause, dead-letters next to nothing
        probes = run.handler_calls() - opened_calls
        dead = _dead(run)
        print(f"[faults] scenario 25: {opened_dead} dead letters when the breaker opened, "
              f"{len(dead)} after {window:.1f}s open; {probes} handler calls meanwhile; "
              f"{len(produced.ids)} events")  # fmt: skip
        assert probes <= window / PAUSE + 2, f"{probes} handler calls in {window:.1f}s open"
        assert len(dead) <= FAILURES + window / PAUSE + 1, sorted(dead)
        assert len(dead) * 10 < len(produced.ids), "the breaker let the topic be dead-lettered"
        assert "half-open" in worker.log() and "lost [" not in worker.log(), worker.log_tail()
        # When the fix is deployed, the next probe closes the breaker and the worker drains
        fixed.touch()
        run.wait_caught_up(worker, timeout=60)
        worker.wait_log("circuit breaker closed")
        assert worker.stop() == 0, worker.log_tail()
    run.expect_dead = frozenset(_dead(run))
    run.finish()
    # And the few dead letters, replayed, are applied once each
    replayed = CliRunner().invoke(
        main, ["dlq", "replay", "--topic", f"{run.topic}.dlq", "--bootstrap-servers", run.bootstrap]
    )
    assert replayed.exit_code == 0, replayed.output
    ends = log_ends(run.bootstrap, run.topic, run.partitions)
    replayer = run.factory.start("after-replay")
    wait_for(
        lambda: all(committed(run.bootstrap, run.group, run.topic, run.partitions).get(p, 0) >= e
                    for p, e in ends.items()),
        60, "the replayed dead letters to be consumed",
    )  # fmt: skip
    assert replayer.stop() == 0, replayer.log_tail()
    effects = effect_counts(run.database_url, run.schema)
    assert set(effects) == produced.ids and set(effects.values()) == {1}, effects
