"""Scenario 6: the Kafka broker dies, freezes, or the network to it breaks, under a worker.

These kill and pause the broker, so they run against a broker of their own
(``proxied_broker``, one per module: :mod:`tests.support.proxied`), never
the session's. It sits behind a TCP fault proxy: the broker advertises the
proxy's port, so every client connection after the bootstrap goes through
it, and the network scenario can blackhole or cut them. PostgreSQL is the
session server. The worker must wait each outage out and then catch up by
itself.
"""

from __future__ import annotations

import time

import pytest

from kinbox.ops.worker import EXIT_WEDGED
from tests.support.fault_run import Run
from tests.support.launch import FAST_TIMINGS
from tests.support.proxied import ProxiedBroker
from tests.support.scenario import scenario

SESSION_TIMEOUT = FAST_TIMINGS["session_timeout"]
"""The workers' session timeout: a pause past it costs the member its partitions."""


@pytest.fixture
def fault_bootstrap(proxied_broker: ProxiedBroker) -> str:
    """Every round of this module runs on the proxied broker, never the session's."""
    return proxied_broker.bootstrap_servers


@pytest.fixture
def broker(proxied_broker: ProxiedBroker) -> ProxiedBroker:
    """The module's broker, which these scenarios kill, pause and cut off."""
    return proxied_broker


@scenario("6a", "broker killed", fault="broker SIGKILL + restart")
def test_broker_sigkill_and_restart(run: Run, broker: ProxiedBroker) -> None:
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


@scenario("6b", "broker paused", fault="broker SIGSTOP > session timeout")
def test_broker_paused_longer_than_the_session_timeout(run: Run, broker: ProxiedBroker) -> None:
    produced = run.produce()
    with run.sampling():
        # (20 ms an event: the partitions are applied side by side, and at
        # 5 ms the whole stream was done before the pause took hold)
        worker = run.factory.start("victim", env={"FAULT_SLEEP": "0.02"})
        run.wait_handler_calls(run.rng.randint(20, len(produced.records) // 3))
        # When the broker freezes (connections open, nothing answers) past
        # the session timeout, then thaws
        broker.pause()
        try:
            assert run.handler_calls() < len(produced.ids), "the stream ended first"
            time.sleep(SESSION_TIMEOUT + run.rng.uniform(1.0, 3.0))
        finally:
            broker.resume()
        # Then the worker rides it out. Or librdkafka lost the reply to a
        # commit sent into the frozen broker for good (kinbox.kafka.watch):
        # the worker says so and exits with status 7, and its supervisor (as
        # systemd or Kubernetes would) starts a fresh one, which finishes.
        try:
            run.wait_caught_up(worker, timeout=120)
        except AssertionError:
            if worker.proc.poll() != EXIT_WEDGED:
                raise
            assert "has not returned from" in worker.log(), worker.log_tail()
            print(f"[faults] {worker.name} wedged in librdkafka, exited 7: restarted")
            worker = run.factory.start("victim-restarted", env={"FAULT_SLEEP": "0.02"})
            run.wait_caught_up(worker, timeout=120)
        assert worker.stop() == 0, worker.log_tail()
    run.finish()


@scenario("6c", "kafka network", fault="Kafka link blackholed, then cut")
def test_kafka_network_blackhole_and_cut(run: Run, broker: ProxiedBroker) -> None:
    # Shorter than the session timeout: the member should ride it out in the group.
    plan = [
        ("blackhole", run.rng.uniform(2.0, SESSION_TIMEOUT - 2.0)),
        ("cut", run.rng.uniform(1.0, 3.0)),
    ]
    run.rng.shuffle(plan)
    # Long enough to outlast both faults: the worker applies its partitions
    # side by side (~150 events/s at 20 ms each) and keeps applying what it
    # fetched while the link is down.
    produced = run.produce(count=5 * run.events)
    with run.sampling():
        # Given a worker applying events over a proxied link to the broker
        worker = run.factory.start("victim", env={"FAULT_SLEEP": "0.02"})
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
