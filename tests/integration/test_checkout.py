"""The inbox pool's checkout check against the real server: a terminated connection is replaced."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from kinbox.core.event import Event
from kinbox.core.steps import Claim, Seen, Steps
from kinbox.devstack.stack import Stack
from kinbox.store import checkout
from kinbox.store.awaiting import AsyncPostgresInboxStore
from kinbox.store.postgres import PostgresInboxStore
from tests.support.database import Conn, prepare_schema


def ev(event_id: str) -> Event:
    return Event(id=event_id, topic="t", partition=0, offset=0, key=None, value=b"")


def terminated_then_claimed(stack: Stack, schema: str, db: Conn) -> tuple[int, int]:
    """Terminate the pool's only connection between two transactions; the backends' pids."""
    prepare_schema(stack.database_url, schema)
    store = PostgresInboxStore(stack.database_url, schema=schema, consumer="g", pool_size=1)
    store.open()
    try:
        with store.transaction() as tx:
            tx.claim([ev("a")])
            first = tx.connection.info.backend_pid
        db.execute("SELECT pg_terminate_backend(%s)", (first,))
        time.sleep(0.5)  # the server's goodbye reaches the idle connection
        # When the next batch takes a connection, it gets a working one: no failed batch
        with store.transaction() as tx:
            assert [e.id for e in tx.claim([ev("a"), ev("b")])] == ["b"]
            second = tx.connection.info.backend_pid
        return first, second
    finally:
        store.close()


def round_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Record each round-trip check the checkout makes (and still make it)."""
    calls: list[int] = []
    real = ConnectionPool.check_connection

    def counted(conn: Any) -> None:
        calls.append(conn.info.backend_pid)
        real(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    return calls


def test_a_connection_the_server_terminated_is_replaced_without_a_round_trip(
    stack: Stack, schema: str, db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = round_trips(monkeypatch)
    first, second = terminated_then_claimed(stack, schema, db)
    # Only the first checkout of each connection cost a round trip: the
    # terminated one was told from its socket alone
    assert second != first
    assert calls == [first, second]


def test_a_connection_idle_for_long_is_checked_with_a_round_trip(
    stack: Stack, schema: str, db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkout, "RECHECK_AFTER", 0.1)
    calls = round_trips(monkeypatch)
    first, second = terminated_then_claimed(stack, schema, db)
    assert second != first
    assert calls[-2:] == [first, second]  # idle past the limit: checked with a round trip


def test_the_async_pool_replaces_a_terminated_connection_without_a_round_trip(
    stack: Stack, schema: str, db: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = AsyncConnectionPool.check_connection

    async def counted(conn: Any) -> None:
        calls.append(conn.info.backend_pid)
        await real(conn)

    monkeypatch.setattr(AsyncConnectionPool, "check_connection", staticmethod(counted))
    prepare_schema(stack.database_url, schema)
    store = AsyncPostgresInboxStore(stack.database_url, schema=schema, consumer="g", pool_size=1)
    try:
        first = store.run(claimed("a"))
        db.execute("SELECT pg_terminate_backend(%s)", (first,))
        time.sleep(0.5)  # the server's goodbye reaches the idle connection
        # The next transaction gets a working connection: no failed batch
        second = store.run(claimed("a", "b"))
        third = store.run(claimed("c"))
    finally:
        store.close()
    assert second != first and third == second
    # Only the first checkout of each connection cost a round trip
    assert calls == [first, second]


def claimed(*ids: str) -> Callable[[Seen], Steps[int]]:
    """A program claiming ``ids``; it returns its connection's backend pid."""

    def program(tx: Seen) -> Steps[int]:
        yield Claim([ev(i) for i in ids])
        return int(tx.connection.info.backend_pid)

    return program
