"""The contract suite's sides: each test runs once over the fake and once over the real thing.

The real sides use the session's stack (``stack`` in tests/conftest.py),
requested only when a real side is, so the fake sides need no services. The
real sides are also marked ``integration``: ``-m "contract and not
integration"`` runs the fakes alone.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kinbox.devstack.stack import Stack
from tests.contract.kafka_sides import (
    FakePublisherSide,
    FakeTransportSide,
    KafkaPublisherSide,
    KafkaTransportSide,
    PublisherSide,
    TransportSide,
)
from tests.contract.store_sides import AsyncPostgresSide, FakeSide, PostgresSide, StoreSide

REAL = pytest.mark.integration


@pytest.fixture(
    params=[
        "fake",
        pytest.param("postgres", marks=REAL),
        pytest.param("async-postgres", marks=REAL),
    ]
)
def inbox(request: pytest.FixtureRequest) -> Iterator[StoreSide]:
    """An inbox store, fake or PostgreSQL (its own schema and fault proxy), sync or async."""
    if request.param == "fake":
        yield FakeSide()
        return
    stack: Stack = request.getfixturevalue("stack")
    schema: str = request.getfixturevalue("schema")
    side_class = PostgresSide if request.param == "postgres" else AsyncPostgresSide
    with side_class.running(stack.database_url, schema) as side:
        yield side


@pytest.fixture(params=["fake", pytest.param("kafka", marks=REAL)])
def consumer(request: pytest.FixtureRequest) -> Iterator[TransportSide]:
    """A transport side, fake or a real group member on the test broker."""
    if request.param == "fake":
        yield FakeTransportSide()
        return
    stack: Stack = request.getfixturevalue("stack")
    with KafkaTransportSide.running(stack.bootstrap_servers) as side:
        yield side


@pytest.fixture(
    params=["fake", pytest.param("kafka", marks=REAL), pytest.param("kafka-relay", marks=REAL)]
)
def producer(request: pytest.FixtureRequest) -> Iterator[PublisherSide]:
    """A publisher side: fake, or the real one on the test broker (dead letters', the relay's)."""
    if request.param == "fake":
        yield FakePublisherSide()
        return
    stack: Stack = request.getfixturevalue("stack")
    side = KafkaPublisherSide(stack.bootstrap_servers, relay=request.param == "kafka-relay")
    yield side
    side.publisher.close()
