"""Scenario 9: the handler fails transiently k times, then succeeds.

The whole partition batch is rolled back on each failure and retried with
backoff; the offset never moves past the failed event; in the end every
event is applied exactly once.
"""

from __future__ import annotations

from tests.support.fault_run import Run
from tests.support.scenario import scenario


@scenario("9", "transient handler errors", fault="handler raises k times")
def test_transient_handler_errors_k_times(run: Run) -> None:
    k = run.rng.randint(1, 3)
    every = run.rng.choice([7, 25, 60])
    run.produce(duplicates=run.rng.randint(0, 10))
    with run.sampling():
        # Given a handler that fails the first k attempts of every `every`-th event
        worker = run.factory.start(
            "victim",
            env={"FAULT_FAIL_TIMES": str(k), "FAULT_FAIL_EVERY": str(every)},
        )
        # Then the worker retries until all of them are applied
        run.wait_caught_up(worker)
        failures = worker.log().count("TransientHandlerError")
        assert failures >= k, f"expected >= {k} injected failures\n{worker.log_tail()}"
        assert worker.stop() == 0, worker.log_tail()
    run.finish()
