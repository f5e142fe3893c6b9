"""Scenarios 4-5: PostgreSQL goes away under a running worker.

These restart the server and kill its backends, so they run against a
PostgreSQL server of their own (module-scoped, ``fault_database_url`` below),
never the session's. Kafka is the session broker. The worker must ride the
outage out (retry with backoff, stay in the group) and then catch up by
itself; a clean drain and the invariant checks follow.
"""

from __future__ import annotations

import time

import pytest

from kinbox.devstack.postgres import PostgresServer
from tests.support.database import terminate_open_transactions
from tests.support.fault_run import Run
from tests.support.faultproxy import FaultProxy
from tests.support.scenario import scenario
from tests.support.waiting import wait_for
from tests.support.workers import HANDLERS, read_deliveries


@pytest.fixture(scope="module")
def postgres(own_postgres: PostgresServer) -> PostgresServer:
    """A PostgreSQL server these tests may restart and disturb (not the shared one)."""
    return own_postgres


@pytest.fixture
def fault_database_url(postgres: PostgresServer) -> str:
    """Every round of this module runs on that server, never the session's."""
    return postgres.url


@scenario(
    "4a", "postgres restart ({case})", fault="pg restart -m immediate", cases=HANDLERS
)  # fmt: skip
def test_postgres_immediate_restart_mid_stream(
    run: Run, postgres: PostgresServer, handler: str
) -> None:
    run.factory.handler = handler
    produced = run.produce()
    # The crash must meet an open transaction, whatever the machine's load: a
    # restart that fell between two batches (or after the last) could be met
    # by the pool's next connection without any failure to see. So one event
    # mid-stream is held inside its transaction until the server is back.
    held = f"{run.group}-ev-{run.rng.randint(20, len(produced.records) // 2)}"
    gate = run.log_dir / "gate"
    env = {
        "FAULT_SLEEP": "0.005",
        "FAULT_SLOW_IDS": held,
        "FAULT_SLOW_SECONDS": "60",  # a safety net: the gate opens long before
        "FAULT_GATE": str(gate),
    }
    with run.sampling():
        # Given a worker applying events (5 ms each, inside the transaction),
        # its transaction open on one of them
        worker = run.factory.start("victim", env=env)
        wait_for(lambda: held in read_deliveries(run.log_dir).holds, 60, f"{held} held")
        # When the server crashes (SIGQUIT: every session aborted) and comes back
        postgres.restart(immediate=True)
        gate.touch()
        # Then the same worker sees the failure, recovers and commits everything
        run.wait_caught_up(worker)
        assert "failure at" in worker.log(), "the fault went unnoticed\n" + worker.log_tail()
        assert worker.stop() == 0, worker.log_tail()
    run.finish()


@scenario("4b", "backend terminated", fault="pg_terminate_backend in tx")
def test_pg_terminate_backend_mid_transaction(run: Run, postgres: PostgresServer) -> None:
    run.produce()
    kills = run.rng.randint(2, 4)
    with run.sampling():
        # 20 ms an event: with partitions applied side by side, the stream
        # must still outlast the kills
        worker = run.factory.start("victim", env={"FAULT_SLEEP": "0.02"})
        terminated = 0
        deadline = time.monotonic() + 60
        # Kill the worker's backend inside its open transaction, several times.
        while terminated < kills and time.monotonic() < deadline:
            run.wait_handler_calls(run.handler_calls() + run.rng.randint(5, 30))
            terminated += terminate_open_transactions(postgres.url)
        assert terminated >= kills, f"only {terminated} backends caught in a transaction"
        run.wait_caught_up(worker)
        assert "failure at" in worker.log(), "the fault went unnoticed\n" + worker.log_tail()
        assert worker.stop() == 0, worker.log_tail()
    run.finish()


@scenario(
    "5", "cut during commit {case}", fault="cut during COMMIT ({case})",
    cases={"applied": {"forward": True}, "not-sent": {"forward": False}},
)  # fmt: skip
def test_connection_cut_during_commit(run: Run, postgres: PostgresServer, forward: bool) -> None:
    with FaultProxy(postgres.port) as proxy:
        run.produce()
        via_proxy = postgres.url.replace(f":{postgres.port}/", f":{proxy.port}/")
        with run.sampling():
            # Given a worker whose database connection goes through the fault proxy
            worker = run.factory.start(
                "victim", database_url=via_proxy, env={"FAULT_SLEEP": "0.002"}
            )
            run.wait_handler_calls(run.rng.randint(10, 100))
            # When the connection breaks right as a COMMIT goes out (the server
            # commits it, or never sees it), and stays down for a moment
            fired = proxy.cut_when(b"COMMIT", forward=forward)
            assert fired.wait(30), "no COMMIT went through the proxy"
            time.sleep(run.rng.uniform(0.2, 2.0))
            proxy.set_pass()
            # Then the worker resolves it by itself and catches up
            run.wait_caught_up(worker)
            assert "failure at" in worker.log(), "the fault went unnoticed\n" + worker.log_tail()
            assert worker.stop() == 0, worker.log_tail()
        outcome = run.finish()
    if forward:
        # The committed batch came back after the error: suppressed, not re-applied.
        assert outcome.duplicates_suppressed >= 1, outcome
