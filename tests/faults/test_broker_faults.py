"""Scenario 6: the Kafka broker dies, freezes, or the network to it breaks, under a worker.

These kill and pause the broker, so they run against a broker of their own
(module-scoped), never the session's. It sits behind a TCP fault proxy: the
broker advertises the proxy's port, so every client connection after the
bootstrap goes through it, and the network scenario can blackhole or cut
them. PostgreSQL is the session server. The worker must wait each outage out
and then catch up by itself.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kinbox.devstack.kafka import KafkaBroker
from kinbox.devstack.stack import Stack
from kinbox.errors import ServiceError
from tests.conftest import cannot_start
from tests.faults.conftest import Faults
from tests.support.faultproxy import FaultProxy
from tests.support.workers import FAST_ENV


@dataclass(frozen=True)
class ProxiedBroker:
    """A broker these scenarios may kill and pause, and the proxy its clients go through."""

    server: KafkaBroker
    proxy: FaultProxy

    def kill(self) -> None:
        """SIGKILL the broker."""
        self.server.kill()

    def start(self) -> None:
        """Start the broker again (same ports, same data)."""
        self.server.start()

    def pause(self) -> None:
        """SIGSTOP the broker."""
        self.server.pause()

    def resume(self) -> None:
        """SIGCONT the broker."""
        self.server.resume()

    @property
    def bootstrap_servers(self) -> str:
        """The advertised address: the proxy's."""
        return self.server.bootstrap_servers


@pytest.fixture(scope="module")
def broker() -> Iterator[ProxiedBroker]:
    """A Kafka broker behind a fault proxy (the proxy first: the broker advertises its port)."""
    proxy = FaultProxy(None)
    server = KafkaBroker(advertised_port=proxy.port)
    proxy.target = ("127.0.0.1", server.port)
    proxy.start()
    try:
        server.start()
    except ServiceError as exc:
        proxy.close()
        cannot_start("Kafka", exc)
    yield ProxiedBroker(server, proxy)
    server.close()
    proxy.close()


def test_broker_sigkill_and_restart(faults: Faults, stack: Stack, broker: ProxiedBroker) -> None:
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
    faults: Faults, stack: Stack, broker: ProxiedBroker
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


def test_kafka_network_blackhole_and_cut(
    faults: Faults, stack: Stack, broker: ProxiedBroker
) -> None:
    session_timeout = float(FAST_ENV["KINBOX_SESSION_TIMEOUT"])
    for index in range(faults.runs):
        with faults.run(
            index,
            "Kafka link blackholed, then cut",
            scenario="6c kafka network",
            bootstrap=broker.bootstrap_servers,
            database_url=stack.database_url,
        ) as run:
            # Shorter than the session timeout: the member should ride it out in the group.
            plan = [
                ("blackhole", run.rng.uniform(2.0, session_timeout - 2.0)),
                ("cut", run.rng.uniform(1.0, 3.0)),
            ]
            run.rng.shuffle(plan)
            produced = run.produce()
            with run.sampling():
                # Given a worker applying events over a proxied link to the broker
                worker = run.factory.start("victim", env={"FAULT_SLEEP": "0.01"})
                for mode, seconds in plan:
                    run.wait_handler_calls(run.handler_calls() + run.rng.randint(20, 50))
                    assert run.handler_calls() < len(produced.ids), "the stream ended first"
                    # When the link delivers nothing (blackhole) or is reset (cut) for a while
                    before = broker.proxy.accepted
                    (broker.proxy.set_blackhole if mode == "blackhole" else broker.proxy.cut)()
                    time.sleep(seconds)
                    broker.proxy.set_pass()
                    print(f"[faults] {mode} for {seconds:.1f}s ({broker.proxy.accepted - before} "
                          "connections accepted meanwhile)")  # fmt: skip
                # Then the same worker catches up by itself
                run.wait_caught_up(worker, timeout=120)
                assert worker.stop() == 0, worker.log_tail()
            run.finish()
