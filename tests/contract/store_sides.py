"""The inbox stores under one contract: what a test does to each, and how it looks inside.

A test speaks to the store only through the seam (:meth:`InboxStore.run`,
with programs of :mod:`kinbox.core.steps`) and a :class:`StoreSide`: a
handler's call doing the few things a handler does to ``tx`` (write, run a
statement the database refuses, swallow that, meet an outage, fail), a way
to lose the answer of the next COMMIT, and :meth:`StoreSide.row`, which
reads a ``processed_events`` row back — from the database for the real
stores, from its state for the fake.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from kinbox.core.inbox import InboxStore
from kinbox.core.steps import Call, Guard
from kinbox.store.awaiting import AsyncPostgresInboxStore
from kinbox.store.postgres import PostgresInboxStore
from kinbox.testing import FakeStore
from kinbox.testing.store import FakeConn
from tests.support.database import prepare_schema
from tests.support.faultproxy import FaultProxy

CONSUMER = "contract-group"


@dataclass(frozen=True)
class Row:
    """A ``processed_events`` row, as either store keeps it."""

    status: str
    reason: str | None
    offset: int


REFUSED = "<refused>"
"""In a handler's call: a statement the database refuses for its content (division by zero)."""
SWALLOWED = "<swallowed>"
"""In a handler's call: such a statement, whose error the handler catches and carries on."""
OUTAGE = "<outage>"
"""In a handler's call: a statement meeting a database outage (its connection goes away)."""
FAIL = "<fail>"
"""In a handler's call: the handler raises ``RuntimeError("handler failed")``."""


class StoreSide(Protocol):
    """One inbox store implementation, driven and inspected by the contract tests."""

    name: str
    store: InboxStore

    def other_consumer(self) -> InboxStore:
        """A store on the same data for another consumer group."""

    def looker(self) -> InboxStore:
        """A store of the same consumer whose ``known`` a program may call while it runs."""

    def call(self, *does: str, guard: Guard = "unguarded") -> Call:
        """A handler's call doing ``does`` in order: a value is written, the rest as named."""

    def row(self, event_id: str) -> Row | None:
        """The committed ``processed_events`` row of ``event_id`` for :data:`CONSUMER`."""

    def effects(self) -> list[str]:
        """What :meth:`write` committed, in order."""

    def answer_lost(self) -> contextlib.AbstractContextManager[None]:
        """The next COMMIT in the block takes effect, but the client never hears back."""


class FakeSide:
    """:class:`~kinbox.testing.FakeStore`; its state is the database."""

    name = "fake"

    def __init__(self) -> None:
        self.fake = FakeStore()
        self.store: InboxStore = self.fake

    def other_consumer(self) -> InboxStore:
        return FakeStore()  # one fake store is one consumer's processed_events

    def row(self, event_id: str) -> Row | None:
        if event_id not in self.fake.status:
            return None
        offset = self.fake.claimed[event_id].offset
        return Row(self.fake.status[event_id], self.fake.reasons.get(event_id), offset)

    def effects(self) -> list[str]:
        return list(self.fake.effects)

    def looker(self) -> InboxStore:
        return self.fake

    def call(self, *does: str, guard: Guard = "unguarded") -> Call:
        def run(connection: FakeConn) -> None:
            for what in does:
                if what == REFUSED:
                    connection.fail(psycopg.errors.DivisionByZero("division by zero"))
                elif what == SWALLOWED:
                    with contextlib.suppress(psycopg.Error):
                        connection.fail(psycopg.errors.DivisionByZero("division by zero"))
                elif what == OUTAGE:
                    connection.lose(
                        psycopg.OperationalError("server closed the connection unexpectedly")
                    )
                elif what == FAIL:
                    raise RuntimeError("handler failed")
                else:
                    connection.effects.append(what)

        return Call(run, guard)

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
        self._stores: list[InboxStore] = []
        self.store = self._open(CONSUMER)
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

    def _open(self, consumer: str) -> InboxStore:
        return self._opened(self.kind(self._via_proxy, schema=self._schema_name, consumer=consumer))

    def _opened(self, store: PostgresInboxStore | AsyncPostgresInboxStore) -> InboxStore:
        store.open()
        self._stores.append(store)
        return store

    kind: type[PostgresInboxStore | AsyncPostgresInboxStore] = PostgresInboxStore
    """The store class this side runs."""

    def other_consumer(self) -> InboxStore:
        return self._open(CONSUMER + "-other")

    def looker(self) -> InboxStore:
        # Sync: its look-up waits on the calling thread, wherever the program runs.
        return self._opened(
            PostgresInboxStore(self._via_proxy, schema=self._schema_name, consumer=CONSUMER)
        )

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

    def _statement(self, what: str) -> tuple[sql.SQL | sql.Composed, tuple[Any, ...]]:
        if what in (REFUSED, SWALLOWED):
            return sql.SQL("SELECT 1/0"), ()
        if what == OUTAGE:
            # The server ends this backend, as an administrator or a restart would.
            return sql.SQL("SELECT pg_terminate_backend(pg_backend_pid())"), ()
        return self._insert, (what,)

    def call(self, *does: str, guard: Guard = "unguarded") -> Call:
        def run(connection: psycopg.Connection[Any]) -> None:
            for what in does:
                if what == FAIL:
                    raise RuntimeError("handler failed")
                with contextlib.suppress(psycopg.Error) if what == SWALLOWED else _nothing():
                    connection.execute(*self._statement(what))

        return Call(run, guard)

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
    """:class:`AsyncPostgresInboxStore`: the same programs on an ``AsyncConnection``, on its loop.

    Its handler calls are awaited there, as an async handler's are.
    """

    name = "async-postgres"
    kind = AsyncPostgresInboxStore

    def call(self, *does: str, guard: Guard = "unguarded") -> Call:
        async def run(connection: psycopg.AsyncConnection[Any]) -> None:
            for what in does:
                if what == FAIL:
                    raise RuntimeError("handler failed")
                with contextlib.suppress(psycopg.Error) if what == SWALLOWED else _nothing():
                    await connection.execute(*self._statement(what))

        return Call(run, guard, awaits=True)


def _nothing() -> contextlib.AbstractContextManager[None]:
    return contextlib.nullcontext()
