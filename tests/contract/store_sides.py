"""The inbox stores under one contract: what a test does to each, and how it looks inside.

A test speaks to the store only through the seam (:class:`InboxStore`) and a
:class:`StoreSide`: the few things a handler does to ``tx`` (write, run a
statement the database refuses, meet an outage), a way to lose the answer of
the next COMMIT, and :meth:`StoreSide.row`, which reads a ``processed_events``
row back — from the database for the real store, from its state for the fake.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kinbox.core.inbox import Awaiting, InboxStore, InboxTransaction
from kinbox.store.awaiting import AsyncPostgresInboxStore
from kinbox.store.postgres import PostgresInboxStore
from kinbox.testing import FakeStore
from tests.support.database import prepare_schema
from tests.support.faultproxy import FaultProxy

CONSUMER = "contract-group"


@dataclass(frozen=True)
class Row:
    """A ``processed_events`` row, as either store keeps it."""

    status: str
    reason: str | None
    offset: int


class Transactional(InboxStore, Protocol):
    """A store whose transactions the test holds open, step by step."""

    def transaction(self) -> contextlib.AbstractContextManager[InboxTransaction]:
        """Open a transaction; it commits when the block exits normally."""


class StoreSide(Protocol):
    """One inbox store implementation, driven and inspected by the contract tests."""

    name: str
    store: Transactional

    def other_consumer(self) -> Transactional:
        """A store on the same data for another consumer group."""

    def row(self, event_id: str) -> Row | None:
        """The committed ``processed_events`` row of ``event_id`` for :data:`CONSUMER`."""

    def effects(self) -> list[str]:
        """What :meth:`write` committed, in order."""

    def write(self, tx: InboxTransaction, value: str) -> None:
        """A handler's statement on ``tx.connection`` that writes ``value``."""

    def refused(self, tx: InboxTransaction) -> None:
        """A handler's statement the database refuses for its content (division by zero)."""

    def outage(self, tx: InboxTransaction) -> None:
        """A handler's statement meeting a database outage (its connection goes away)."""

    def answer_lost(self) -> contextlib.AbstractContextManager[None]:
        """The next COMMIT in the block takes effect, but the client never hears back."""


class FakeSide:
    """:class:`~kinbox.testing.FakeStore`; its state is the database."""

    name = "fake"

    def __init__(self) -> None:
        self.fake = FakeStore()
        self.store: Transactional = self.fake

    def other_consumer(self) -> Transactional:
        return FakeStore()  # one fake store is one consumer's processed_events

    def row(self, event_id: str) -> Row | None:
        if event_id not in self.fake.status:
            return None
        offset = self.fake.claimed[event_id].offset
        return Row(self.fake.status[event_id], self.fake.reasons.get(event_id), offset)

    def effects(self) -> list[str]:
        return list(self.fake.effects)

    def write(self, tx: InboxTransaction, value: str) -> None:
        tx.connection.effects.append(value)

    def refused(self, tx: InboxTransaction) -> None:
        tx.connection.fail(psycopg.errors.DivisionByZero("division by zero"))

    def outage(self, tx: InboxTransaction) -> None:
        tx.connection.lose(psycopg.OperationalError("server closed the connection unexpectedly"))

    @contextlib.contextmanager
    def answer_lost(self) -> Iterator[None]:
        self.fake.lose_after_commit = 1
        yield
        assert self.fake.lose_after_commit == 0, "no COMMIT happened"


class PostgresSide:
    """:class:`PostgresInboxStore` on the test server, through a fault proxy that can cut COMMIT."""

    name = "postgres"

    def __init__(self, database_url: str, schema: str, proxy: FaultProxy) -> None:
        prepare_schema(database_url, schema)
        self._url = database_url
        self._schema_name = schema
        self._schema = sql.Identifier(schema)
        self._proxy = proxy
        self._via_proxy = make_conninfo(database_url, host="127.0.0.1", port=proxy.port)
        self._stores = [self._open(CONSUMER)]
        self.store: Transactional = self._stores[0]
        self._insert = sql.SQL("INSERT INTO {}.effects (event_id) VALUES (%s)").format(self._schema)

    @classmethod
    @contextlib.contextmanager
    def running(cls, database_url: str, schema: str) -> Iterator[PostgresSide]:
        """The side, its proxy and its pools, for one test."""
        params = conninfo_to_dict(database_url)
        target = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        with FaultProxy(target) as proxy:
            side = cls(database_url, schema, proxy)
            try:
                yield side
            finally:
                for store in side._stores:
                    store.close()

    def _open(self, consumer: str) -> PostgresInboxStore:
        store = self.kind(self._via_proxy, schema=self._schema_name, consumer=consumer)
        store.open()
        return store

    kind: type[PostgresInboxStore] = PostgresInboxStore
    """The store class this side runs."""

    def other_consumer(self) -> Transactional:
        self._stores.append(self._open(CONSUMER + "-other"))
        return self._stores[-1]

    def _query(self, query: sql.Composed, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self._url, autocommit=True) as conn:
            return conn.execute(query, params).fetchall()

    def row(self, event_id: str) -> Row | None:
        rows = self._query(
            sql.SQL(
                'SELECT status, reason, "offset" FROM {}.processed_events'
                " WHERE consumer = %s AND event_id = %s"
            ).format(self._schema),
            (CONSUMER, event_id),
        )
        return Row(*rows[0]) if rows else None

    def effects(self) -> list[str]:
        query = sql.SQL("SELECT event_id FROM {}.effects ORDER BY seq").format(self._schema)
        return [r[0] for r in self._query(query)]

    def write(self, tx: InboxTransaction, value: str) -> None:
        self.handler_runs(tx, self._insert, (value,))

    def refused(self, tx: InboxTransaction) -> None:
        self.handler_runs(tx, sql.SQL("SELECT 1/0"))

    def outage(self, tx: InboxTransaction) -> None:
        # The server ends this backend, as an administrator or a restart would.
        self.handler_runs(tx, sql.SQL("SELECT pg_terminate_backend(pg_backend_pid())"))

    def handler_runs(
        self, tx: InboxTransaction, statement: sql.SQL | sql.Composed, params: tuple[Any, ...] = ()
    ) -> None:
        """A handler's statement on ``tx.connection``."""
        tx.connection.execute(statement, params)

    @contextlib.contextmanager
    def answer_lost(self) -> Iterator[None]:
        # The COMMIT reaches the server (which commits), then the link breaks
        # before the answer comes back: the client sees the connection die.
        fired = self._proxy.cut_when(b"COMMIT", forward=True)
        try:
            yield
        finally:
            # The client may see the reset before the proxy thread says it fired.
            happened = fired.wait(5)
            self._proxy.set_pass()
        assert happened, "no COMMIT went through the proxy"


class AsyncPostgresSide(PostgresSide):
    """:class:`AsyncPostgresInboxStore`: the same transaction code on an ``AsyncConnection``.

    Its handler statements are awaited on the store's loop, as an async handler's are.
    """

    name = "async-postgres"
    kind = AsyncPostgresInboxStore

    def handler_runs(
        self, tx: InboxTransaction, statement: sql.SQL | sql.Composed, params: tuple[Any, ...] = ()
    ) -> None:
        connection: psycopg.AsyncConnection[Any] = tx.connection
        cast(Awaiting, tx).wait(connection.execute(statement, params))
