"""/livez and /readyz of a real worker and a real relay (--health-port), on the real stack."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from kinbox.devstack.stack import Stack
from kinbox.store.postgres import apply_migrations
from kinbox.store.schema import INBOX
from producer_outbox.schema import OUTBOX
from tests.integration.ops_support import (
    free_port,
    probe,
    produce,
    start_worker,
    stop,
    topic_pair,
)
from tests.support.faultproxy import FaultProxy
from tests.support.outbox import relay_process
from tests.support.waiting import wait_for


def test_a_worker_is_live_at_once_ready_once_assigned_and_not_ready_without_its_database(
    stack: Stack, schema: str
) -> None:
    # Given a worker whose database connection goes through a proxy we can cut
    apply_migrations(stack.database_url, schema, [INBOX, OUTBOX])
    topic = topic_pair(stack.bootstrap_servers, partitions=2)
    host, _, rest = stack.database_url.partition("@")[2].partition(":")
    port_text, _, database = rest.partition("/")
    port = free_port()
    with FaultProxy((host, int(port_text))) as proxy:
        url = f"{stack.database_url.partition('@')[0]}@127.0.0.1:{proxy.port}/{database}"
        worker = start_worker(stack, topic, f"g-{topic}", schema, "--health-port", str(port),
                              database_url=url)  # fmt: skip
        try:
            # When it runs: live at once, ready once it holds partitions
            wait_for(lambda: probe(port, "/livez")[0] == 200, 60, "livez 200")
            wait_for(lambda: probe(port, "/readyz")[0] == 200, 60, "readyz 200")
            assert "2 partitions held, database reachable" in probe(port, "/readyz")[1]
            produce(stack.bootstrap_servers, topic, [{"n": 1}])

            # When the database cannot be reached: not ready, and still live
            # (a restart would not bring the database back)
            proxy.cut()
            wait_for(lambda: probe(port, "/readyz")[0] == 503, 30, "readyz 503")
            assert "database unreachable" in probe(port, "/readyz")[1]
            assert probe(port, "/livez")[0] == 200

            # Then ready again once it can
            proxy.set_pass()
            wait_for(lambda: probe(port, "/readyz")[0] == 200, 30, "readyz 200 again")
            assert probe(port, "/nope")[0] == 404
        finally:
            assert stop(worker) == 0


@pytest.fixture
def hold(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "hold"
    path.touch()
    yield path
    path.unlink(missing_ok=True)


def test_livez_follows_the_polling_thread_not_the_handler(
    stack: Stack, schema: str, hold: Path
) -> None:
    # Given a worker (eager assignment: a rebalance revokes everything, and a
    # revoke waits for the batch in flight, up to 15 s here) whose handler
    # blocks on a file, with /livez failing after 3 s without a poll
    apply_migrations(stack.database_url, schema, [INBOX, OUTBOX])
    topic = topic_pair(stack.bootstrap_servers, partitions=1)
    group = f"g-{topic}"
    port = free_port()
    eager = ["-X", "partition.assignment.strategy=range"]
    env = {"OPS_TEST_HOLD": str(hold), "KINBOX_SHUTDOWN_TIMEOUT": "15"}
    worker = start_worker(stack, topic, group, schema, "--health-port", str(port),
                          "--live-timeout", "3", *eager, env=env)  # fmt: skip
    intruder: Consumer | None = None
    joined = threading.Event()
    try:
        wait_for(lambda: probe(port, "/readyz")[0] == 200, 60, "readyz 200")
        produce(stack.bootstrap_servers, topic, [{"n": 1}])
        wait_for(Path(str(hold) + ".started").exists, 30, "the handler to block")

        # When the handler blocks longer than the threshold: the runner holds
        # the partition and keeps polling, and every poll is a turn
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            code, body = probe(port, "/livez")
            assert code == 200, body
            time.sleep(0.5)

        # When a second member joins: the polling thread waits in the revoke
        # callback for the blocked batch, and does not poll
        intruder = Consumer({
            "bootstrap.servers": stack.bootstrap_servers, "group.id": group,
            "partition.assignment.strategy": "range", "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500, "enable.auto.commit": False,
        })  # fmt: skip
        intruder.subscribe([topic], on_assign=lambda *_: joined.set())
        polling = threading.Thread(
            target=lambda: [intruder.poll(0.2) for _ in range(150) if not joined.is_set()],
            daemon=True,
        )
        polling.start()
        wait_for(lambda: probe(port, "/livez")[0] == 503, 20, "livez 503")
        assert "has not turned for" in probe(port, "/livez")[1]

        # Then, once the batch ends, the loop turns again and /livez recovers
        hold.unlink()
        wait_for(lambda: probe(port, "/livez")[0] == 200, 30, "livez 200 again")
        polling.join(40)
    finally:
        hold.unlink(missing_ok=True)
        if intruder is not None:
            intruder.close()
        assert stop(worker) == 0


def test_a_relay_is_ready_only_while_it_holds_lanes(stack: Stack, schema: str) -> None:
    # Given two relays of one schema with one lane: only one can own it
    apply_migrations(stack.database_url, schema, [INBOX, OUTBOX])
    ports = [free_port(), free_port()]
    relays = [relay_process(stack, schema, "--lanes", "1", "--health-port", str(p)) for p in ports]
    try:
        # Then both are live; exactly one is ready, the other says why not
        for port in ports:
            wait_for(functools.partial(lambda p: probe(p, "/livez")[0] == 200, port), 60, "livez")
        wait_for(lambda: sorted(probe(p, "/readyz")[0] for p in ports) == [200, 503], 30,
                 "one ready relay")  # fmt: skip
        answers = {probe(p, "/readyz")[1].strip() for p in ports}
        assert "ok: 1 lanes held, database reachable" in answers
        assert "fail: no lanes assigned" in answers

        # When the owner stops, the other takes the lane and becomes ready
        owner = next(i for i, p in enumerate(ports) if probe(p, "/readyz")[0] == 200)
        assert stop(relays[owner]) == 0
        other = ports[1 - owner]
        wait_for(lambda: probe(other, "/readyz")[0] == 200, 30, "the other relay ready")
    finally:
        for relay in relays:
            stop(relay)
