"""Fixtures that start the real Kafka broker and PostgreSQL server once per test session.

Every test gets its own topics (``make_topic``) and its own schema (``schema``),
so tests never see each other's rows or records.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from psycopg import sql

from kinbox.devstack.stack import Stack, local_stack
from kinbox.errors import ServiceError
from tests.conftest import CI, STACK_LINES


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    """The running Kafka broker and PostgreSQL server (started here unless given external ones)."""
    try:
        context = local_stack()
        running = context.__enter__()
    except ServiceError as exc:
        if CI:
            pytest.fail(f"the test stack could not start (CI: a failure, not a skip):\n{exc}")
        pytest.skip(f"the test stack could not start: {exc}")
    STACK_LINES.extend(running.describe().splitlines())
    try:
        yield running
    finally:
        context.__exit__(None, None, None)


MakeTopic = Callable[..., str]


@pytest.fixture
def make_topic(stack: Stack) -> MakeTopic:
    """Create a fresh topic: ``make_topic(partitions=3, prefix="t")`` returns its name."""
    admin = AdminClient({"bootstrap.servers": stack.bootstrap_servers})

    def create(partitions: int = 3, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)]
        )
        futures[name].result(timeout=30)
        return name

    return create


@pytest.fixture
def schema(stack: Stack) -> Iterator[str]:
    """A unique, not yet migrated schema name; dropped after the test."""
    name = f"kb_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def db(stack: Stack) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection to the test database."""
    with psycopg.connect(stack.database_url, autocommit=True) as conn:
        yield conn
