"""Scenario 6: the Kafka broker dies (SIGKILL, restart) or freezes (SIGSTOP) under a worker.

These kill and pause the broker, so they run against a broker of their own
(module-scoped), never the session's. PostgreSQL is the session server. The
worker must wait the outage out and then catch up by itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from kinbox.devstack.kafka import KafkaBroker
from kinbox.devstack.stack import Stack
from kinbox.errors import ServiceError
from tests.conftest import CI
from tests.faults.conftest import Faults
from tests.support.workers import FAST_ENV


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaBroker]:
    """A Kafka broker these scenarios may kill and pause."""
    server = KafkaBroker()
    try:
        server.start()
    except ServiceError as exc:
        if CI:
            pytest.fail(f"Kafka could not start (CI: a failure, not a skip):\n{exc}")
        pytest.skip(f"Kafka could not start: {exc}")
    yield server
    server.close()


def test_broker_sigkill_and_restart(faults: Faults, stack: Stack, broker: KafkaBroker) -> None:
    for index in range(faults.runs):
        with faults.run(
            index,
            "broker SIGKILL + restart",
            scenario="6a broker killed",
            bootstrap=broker.bootstrap_servers,
            database_url=stack.database_url,
        ) as run:
            produced = run.produce()
            with run.sampling():
                # Given a worker applying events
                worker = run.factory.start("victim", env={"FAULT_SLEEP": "0.005"})
                run.wait_handler_calls(run.rng.randint(20, len(produced.records) // 2))
                # When the broker is SIGKILLed, stays down a moment, and restarts
                broker.kill()
                time.sleep(run.rng.uniform(0.5, 3.0))
                broker.start()
                # Then the same worker reconnects and commits everything
                run.wait_caught_up(worker, timeout=120)
                assert worker.stop() == 0, worker.log_tail()
            run.finish()


def test_broker_paused_longer_than_the_session_timeout(
    faults: Faults, stack: Stack, broker: KafkaBroker
) -> None:
    session_timeout = float(FAST_ENV["KINBOX_SESSION_TIMEOUT"])
    for index in range(faults.runs):
        with faults.run(
            index,
            "broker SIGSTOP > session timeout",
            scenario="6b broker paused",
            bootstrap=broker.bootstrap_servers,
            database_url=stack.database_url,
        ) as run:
            produced = run.produce()
            with run.sampling():
                worker = run.factory.start("victim", env={"FAULT_SLEEP": "0.005"})
                run.wait_handler_calls(run.rng.randint(20, len(produced.records) // 2))
                # When the broker freezes (connections open, nothing answers) past
                # the session timeout, then thaws
                broker.pause()
                try:
                    time.sleep(session_timeout + run.rng.uniform(1.0, 3.0))
                finally:
                    broker.resume()
                run.wait_caught_up(worker, timeout=120)
                assert worker.stop() == 0, worker.log_tail()
            run.finish()
