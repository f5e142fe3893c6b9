"""Markers by directory; the real Kafka broker and PostgreSQL server for the tests needing them.

``stack`` starts both once per test session (integration and fault tests share
them); every test gets its own topics (``make_topic``) and its own schema
(``schema``), so tests never see each other's rows or records. The CDC tests
(``test_cdc*.py``, marked ``cdc`` too) add a Kafka Connect worker with Debezium
(``connect``), started once per test module against the same broker; the
shared PostgreSQL server runs with ``wal_level=logical`` for them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import psycopg
import pytest

from kinbox.core.errors import ServiceError
from kinbox.devstack.connect import KafkaConnect
from kinbox.devstack.postgres import PostgresServer
from kinbox.devstack.stack import Stack, local_stack, start_connect
from tests.support.database import drop_schema
from tests.support.proxied import ProxiedBroker, start_proxied_broker
from tests.support.topics import create_topic

CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
"""In CI a service that cannot start fails the run; elsewhere it skips the tests that need it."""

_ROOT = Path(__file__).parent

STACK_LINES: list[str] = []
"""What the integration fixtures started (versions, pids, addresses), printed at the end."""

REPORT_LINES: list[str] = []
"""Figures tests report (duplicates suppressed, ...), printed at the end of the run."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        help="fault suite in long mode: many seeded runs per scenario (KINBOX_FAULTS_LONG=1)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # tests/faults/conftest.py reads the mode when it is imported, during
    # collection, which comes after this hook.
    if config.getoption("--long"):
        os.environ["KINBOX_FAULTS_LONG"] = "1"


_MARKED_DIRECTORIES = {"unit", "integration", "faults", "contract", "examples", "console"}
"""Each test in one of these directories gets its name as a marker (``examples``: integration)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(_ROOT).parts
        if parts and parts[0] in _MARKED_DIRECTORIES:
            item.add_marker(parts[0] if parts[0] != "examples" else "integration")
        if parts and parts[-1].startswith("test_cdc"):
            item.add_marker("cdc")


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say which real services the integration tests run against (filled in when they start)."""
    from kinbox.devstack.kafka_jars import kafka_version
    from kinbox.devstack.stack import EXTERNAL_DATABASE_ENV, EXTERNAL_KAFKA_ENV

    kafka = os.environ.get(EXTERNAL_KAFKA_ENV) or f"Apache Kafka {kafka_version()} (JVM, local)"
    postgres = os.environ.get(EXTERNAL_DATABASE_ENV) or "PostgreSQL (local private cluster)"
    return [f"kinbox stack: {kafka}; {postgres}; CI={CI}"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print which real Kafka broker and PostgreSQL server the tests ran against."""
    if STACK_LINES:
        terminalreporter.section("kinbox stack")
        for line in STACK_LINES:
            terminalreporter.write_line(line)
    if REPORT_LINES:
        terminalreporter.section("kinbox reports")
        for line in REPORT_LINES:
            terminalreporter.write_line(line)


def cannot_start(what: str, exc: ServiceError) -> NoReturn:
    """A service a test needs did not start: a failure in CI, a skip elsewhere."""
    if CI:
        pytest.fail(f"{what} could not start (CI: a failure, not a skip):\n{exc}")
    pytest.skip(f"{what} could not start: {exc}")


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """The running Kafka broker and PostgreSQL server (started here unless given external ones).

    PostgreSQL started here records commit times, as the benchmark's does, so
    the latency scenario's quick mode times each effect to its COMMIT.
    """
    try:
        context = local_stack(postgres_settings={"track_commit_timestamp": "on"})
        running = context.__enter__()
    except ServiceError as exc:
        cannot_start("the test stack", exc)
    STACK_LINES.extend(running.describe().splitlines())
    try:
        yield running
    finally:
        context.__exit__(None, None, None)


MakeTopic = Callable[..., str]


@pytest.fixture
def make_topic(stack: Stack) -> MakeTopic:
    """Create a fresh topic: ``make_topic(partitions=3, prefix="t")`` returns its name."""

    def create(partitions: int = 3, prefix: str = "t") -> str:
        return create_topic(stack.bootstrap_servers, partitions=partitions, prefix=prefix)

    return create


@pytest.fixture
def schema(stack: Stack) -> Iterator[str]:
    """A unique, not yet migrated schema name; dropped after the test."""
    name = f"kb_{uuid.uuid4().hex[:12]}"
    yield name
    drop_schema(stack.database_url, name)


@pytest.fixture
def db(stack: Stack) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection to the test database."""
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def connect(stack: Stack) -> Iterator[KafkaConnect]:
    """A Kafka Connect worker (distributed) with Debezium, on the session's broker, per module."""
    try:
        worker = start_connect(stack.bootstrap_servers)
    except ServiceError as exc:
        cannot_start("Kafka Connect", exc)
    STACK_LINES.append(
        f"Kafka Connect {worker.version} with Debezium {worker.debezium_version} "
        f"at {worker.rest_url} (pid {worker.pid})"
    )
    yield worker
    worker.close()


@pytest.fixture(scope="module")
def proxied_broker() -> Iterator[ProxiedBroker]:
    """A Kafka broker of the test module's own, behind a fault proxy (:mod:`tests.support.proxied`).

    Its bootstrap address is the proxy's: every client connection goes through it.
    """
    try:
        running = start_proxied_broker()
    except ServiceError as exc:
        cannot_start("Kafka", exc)
    yield running
    running.close()


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test module's own, which its tests may restart and disturb."""
    server = PostgresServer()
    try:
        server.start()
    except ServiceError as exc:
        cannot_start("PostgreSQL", exc)
    yield server
    server.close()
