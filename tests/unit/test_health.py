"""Health on a fake clock, the server's answers, and what the observed transport feeds it."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping

import pytest

from kinbox.core.errors import TransportError
from kinbox.core.transport import Partition
from kinbox.ops.health import Health, HealthServer, ObservedTransport
from kinbox.testing import FakeTransport

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_live_until_the_loop_misses_its_threshold() -> None:
    clock = Clock()
    health = Health(5.0, "partitions", clock=clock)
    assert health.live()[0]  # start-up counts as a turn
    clock.now += 5.1
    ok, why = health.live()
    assert not ok and "has not turned for 5.1s (threshold 5.0s)" in why
    health.turned()
    assert health.live()[0]


def test_ready_needs_live_something_held_and_the_database() -> None:
    clock = Clock()
    answers: list[str | None] = ["connection refused", None]
    checks: list[float] = []

    def database() -> str | None:
        checks.append(clock.now)
        return answers[0]

    health = Health(5.0, "lanes", database=database, clock=clock)
    assert health.ready() == (False, "no lanes assigned")
    health.holding(3)
    assert health.ready() == (False, "database unreachable: connection refused")
    # The answer is reused for a moment: probes never queue connections.
    answers.pop(0)
    assert not health.ready()[0] and len(checks) == 1
    clock.now += 2.0
    assert health.ready() == (True, "3 lanes held, database reachable")
    clock.now += 6.0
    assert not health.ready()[0]  # not live, whatever else holds


def test_the_server_answers_200_503_and_404() -> None:
    clock = Clock()
    health = Health(5.0, "partitions", clock=clock)
    server = HealthServer(health, 0, host="127.0.0.1").start()
    try:

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}") as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()

        assert get("/livez")[0] == 200
        assert get("/readyz") == (503, "fail: no partitions assigned\n")
        health.holding(1)
        assert get("/readyz?verbose") == (200, "ok: 1 partitions held, database reachable\n")
        assert get("/metrics")[0] == 404
    finally:
        server.close()


class Listener:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Partition]]] = []

    def on_assigned(self, partitions: list[Partition]) -> None:
        self.calls.append(("assigned", partitions))

    def on_revoked(self, partitions: list[Partition]) -> None:
        self.calls.append(("revoked", partitions))

    def on_lost(self, partitions: list[Partition]) -> None:
        self.calls.append(("lost", partitions))

    def on_committed(self, offsets: Mapping[Partition, int], error: TransportError | None) -> None:
        self.calls.append(("committed", list(offsets)))


def test_the_observed_transport_counts_polls_and_held_partitions() -> None:
    clock = Clock()
    health = Health(5.0, "partitions", clock=clock)
    inner = FakeTransport({("t", 0): [], ("t", 1): []})
    observed = ObservedTransport(inner, health)
    listener = Listener()
    observed.subscribe(["t"], listener)
    clock.now += 10
    observed.poll(10, 0.0)  # the fake assigns in its first poll
    assert health.live()[0]
    assert listener.calls == [("assigned", [("t", 0), ("t", 1)])]
    assert health.ready() == (True, "2 partitions held, database reachable")
    inner.revoke([("t", 1)], lost=True)
    assert health.ready() == (True, "1 partitions held, database reachable")
    inner.revoke([("t", 0)])
    assert listener.calls[-1] == ("revoked", [("t", 0)])
    assert health.ready() == (False, "no partitions assigned")
