"""Scenarios 4-5: PostgreSQL goes away under a running worker.

These restart the server and kill its backends, so they run against a
PostgreSQL server of their own (module-scoped), never the session's. Kafka is
the session broker. The worker must ride the outage out (retry with backoff,
stay in the group) and then catch up by itself; a clean drain and the
invariant checks follow.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from kinbox.devstack.postgres import PostgresServer
from kinbox.devstack.stack import Stack
from tests.faults.conftest import Faults
from tests.support.faultproxy import FaultProxy


@pytest.fixture(scope="module")
def postgres(own_postgres: PostgresServer) -> PostgresServer:
    """A PostgreSQL server these tests may restart and disturb (not the shared one)."""
    return own_postgres


def _terminate_worker_transactions(database_url: str) -> int:
    """``pg_terminate_backend`` every session that sits inside an open transaction.

    The worker's handler sleeps inside its transaction, so its backend shows
    ``idle in transaction``; the test's own connections are autocommit and
    never do.
    """
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND state = 'idle in transaction'"
        ).fetchall()
    return sum(1 for (ok,) in rows if ok)


def test_postgres_immediate_restart_mid_stream(
    faults: Faults, stack: Stack, postgres: PostgresServer
) -> None:
    for index in range(faults.runs):
        with faults.run(
            index,
            "pg restart -m immediate",
            scenario="4a postgres restart",
            bootstrap=stack.bootstrap_servers,
            database_url=postgres.url,
        ) as run:
            produced = run.produce()
            with run.sampling():
                # Given a worker applying events (5 ms each, inside the transaction)
                worker = run.factory.start("victim", env={"FAULT_SLEEP": "0.005"})
                run.wait_handler_calls(run.rng.randint(20, len(produced.records) // 2))
                # When the server crashes (SIGQUIT: every session aborted) and comes back
                postgres.restart(immediate=True)
                # Then the same worker recovers and commits everything
                run.wait_caught_up(worker)
                assert "failure at" in worker.log(), (
                    "the fault went unnoticed\n" + worker.log_tail()
                )
                assert worker.stop() == 0, worker.log_tail()
            run.finish()


def test_pg_terminate_backend_mid_transaction(
    faults: Faults, stack: Stack, postgres: PostgresServer
) -> None:
    for index in range(faults.runs):
        with faults.run(
            index,
            "pg_terminate_backend in tx",
            scenario="4b backend terminated",
            bootstrap=stack.bootstrap_servers,
            database_url=postgres.url,
        ) as run:
            run.produce()
            kills = run.rng.randint(2, 4)
            with run.sampling():
                # 20 ms an event: with partitions applied side by side, the
                # stream must still outlast the kills
                worker = run.factory.start("victim", env={"FAULT_SLEEP": "0.02"})
                terminated = 0
                deadline = time.monotonic() + 60
                # Kill the worker's backend inside its open transaction, several times.
                while terminated < kills and time.monotonic() < deadline:
                    run.wait_handler_calls(run.handler_calls() + run.rng.randint(5, 30))
                    terminated += _terminate_worker_transactions(postgres.url)
                assert terminated >= kills, f"only {terminated} backends caught in a transaction"
                run.wait_caught_up(worker)
                assert "failure at" in worker.log(), (
                    "the fault went unnoticed\n" + worker.log_tail()
                )
                assert worker.stop() == 0, worker.log_tail()
            run.finish()


@pytest.mark.parametrize("forward", [True, False], ids=["commit-reached-server", "commit-lost"])
def test_connection_cut_during_commit(
    faults: Faults, stack: Stack, postgres: PostgresServer, forward: bool
) -> None:
    for index in range(faults.runs):
        with (
            FaultProxy(postgres.port) as proxy,
            faults.run(
                index,
                "cut during COMMIT" + (" (applied)" if forward else " (not sent)"),
                scenario="5 cut during commit" + (" fwd" if forward else " drop"),
                bootstrap=stack.bootstrap_servers,
                database_url=postgres.url,
            ) as run,
        ):
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
                assert "failure at" in worker.log(), (
                    "the fault went unnoticed\n" + worker.log_tail()
                )
                assert worker.stop() == 0, worker.log_tail()
            outcome = run.finish()
            if forward:
                # The committed batch came back after the error: suppressed, not re-applied.
                assert outcome.duplicates_suppressed >= 1, outcome
