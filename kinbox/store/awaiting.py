"""The inbox store of async handlers: the engine's transaction program, run on an event loop.

:class:`AsyncPostgresInboxStore` keeps an ``AsyncConnectionPool`` on an event
loop of its own (:class:`~kinbox.store.loop.LoopThread`). Its :meth:`~AsyncPostgresInboxStore.run`
hands the whole transaction to that loop at once, and
:func:`~kinbox.store.async_transaction.drive_async` runs the program's steps
there natively: each statement awaited on the
``AsyncConnection``, each async handler awaited with it, so the batch thread
waits once per transaction, and nothing crosses a thread per statement or
per handler. The statements, and how their answers and failures are judged,
are the sync store's (:mod:`kinbox.store.transaction`).

:class:`MixedInboxStore` is the store a worker runs with: the sync store
itself, and, from :meth:`~MixedInboxStore.for_async`, an
:class:`AsyncPostgresInboxStore` over the same tables for the routes whose
handler is ``async def`` (asked once, when the batch code is set up; an app
with no async handler never starts the loop). Closing it closes both, after
the worker's last offsets are committed: the pools, then the loop.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from kinbox.core.event import Event
from kinbox.core.inbox import InboxStore, Invoke
from kinbox.core.names import sql_identifier
from kinbox.core.steps import Program
from kinbox.store.async_transaction import AsyncTransaction, drive_async
from kinbox.store.checkout import Checkout
from kinbox.store.cursors import configure_async
from kinbox.store.errors import aborted_at_commit, translate
from kinbox.store.loop import LoopThread
from kinbox.store.postgres import PostgresInboxStore
from kinbox.store.statements import InboxStatements
from kinbox.store.transaction import aborted, known_params, unsendable

T = TypeVar("T")


class AsyncPostgresInboxStore:
    """An inbox store whose transactions run on an ``AsyncConnection``, for async handlers.

    Args: as :class:`~kinbox.store.postgres.PostgresInboxStore`; at most
    ``pool_size`` connections, in an ``AsyncConnectionPool``. Its loop thread
    starts now; its pool opens with the first transaction.
    """

    def __init__(self, conninfo: str, *, schema: str, consumer: str, pool_size: int = 2) -> None:
        self._sql = InboxStatements.of(sql_identifier(schema, setting="schema"))
        self._consumer = consumer
        self._loop = LoopThread("kinbox-async-handlers")
        self._checkout = Checkout()
        self._opened = False
        self._opening = threading.Lock()

        async def make() -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
            # On the loop: asyncio's objects belong to the loop they are made
            # on. The check is the sync pool's (kinbox.store.checkout): a
            # connection a server restart killed is replaced instead of
            # failing a batch, mostly without a round trip.
            return AsyncConnectionPool(
                conninfo,
                min_size=1,
                max_size=max(1, pool_size),
                open=False,
                check=self._checkout.check_async,
                configure=configure_async,
                name="kinbox-inbox-async",
            )

        self._pool = self._loop.run(make())

    def open(self, timeout: float = 30.0) -> None:
        """Open the pool, without waiting for a connection (idempotent).

        The tables were checked when the worker's sync store opened; a
        database that cannot be reached now is met by the first transaction,
        as any outage is: the batch waits.

        Raises:
            StoreError: the pool could not be opened.
        """
        with self._opening:
            if not self._opened:
                try:
                    self._loop.run(self._pool.open(wait=False, timeout=timeout))
                except psycopg.Error as exc:
                    raise translate(exc) from exc
                self._opened = True

    def run(self, program: Program[T]) -> T:
        """See :meth:`~kinbox.core.inbox.InboxStore.run`: on the loop, every step awaited there."""
        if not self._opened:
            self.open()
        return self._loop.run(self._run(program))

    async def _run(self, program: Program[T]) -> T:
        held: psycopg.AsyncConnection[Any] | None = None  # none yet: taking one failed
        try:
            async with self._pool.connection() as conn:
                held = conn
                try:
                    async with conn.transaction():
                        result = await drive_async(
                            program, AsyncTransaction(conn, self._consumer, self._sql)
                        )
                        # psycopg would send COMMIT, PostgreSQL would answer
                        # ROLLBACK, and nothing would be raised.
                        if aborted(conn):
                            raise aborted_at_commit()
                finally:
                    self._checkout.given_back(conn)
                return result
        except psycopg.Error as exc:
            # Taking a connection, BEGIN, COMMIT or ROLLBACK: COMMIT runs the
            # handlers' deferred checks, so it is judged as their statements are.
            raise translate(exc, held, own=False) from exc

    def known(self, events: Sequence[Event]) -> set[str]:
        """See :meth:`~kinbox.core.inbox.InboxStore.known`: one statement, in autocommit."""
        if not events:
            return set()
        if not self._opened:
            self.open()
        return self._loop.run(self._known(events))

    async def _known(self, events: Sequence[Event]) -> set[str]:
        try:
            async with self._pool.connection() as conn:
                await conn.set_autocommit(True)
                try:
                    cursor = await conn.execute(
                        self._sql.known, known_params(self._consumer, events), prepare=False
                    )
                    rows = await cursor.fetchall()
                except psycopg.Error as exc:
                    raise translate(exc, conn) from exc
                finally:
                    if not conn.closed:
                        await conn.set_autocommit(False)
                    self._checkout.given_back(conn)
        except psycopg.Error as exc:  # taking a connection, or setting autocommit
            raise translate(exc) from exc
        except ValueError as exc:  # an id the client encoding cannot encode
            raise unsendable(exc) from exc
        return {row[0] for row in rows}

    def close(self) -> None:
        """Close the pool, then stop the loop."""
        try:
            if self._opened and self._loop.running:
                self._loop.run(self._pool.close(timeout=5.0))
        finally:
            self._loop.stop()

    def sessions(self, session_class: type) -> Callable[[Invoke], Invoke]:
        """``AsyncSession`` s (:mod:`kinbox.store.orm_async`), for async handlers."""
        from kinbox.store.orm_async import AsyncSessions  # loaded only for handlers that ask

        return AsyncSessions(session_class).around


class MixedInboxStore(PostgresInboxStore):
    """The worker's inbox store: sync transactions, and async ones for async handlers.

    Args: as :class:`~kinbox.store.postgres.PostgresInboxStore` (the async
    store gets its own pool of up to ``pool_size`` connections).
    """

    def __init__(self, conninfo: str, *, schema: str, consumer: str, pool_size: int = 2) -> None:
        super().__init__(conninfo, schema=schema, consumer=consumer, pool_size=pool_size)
        self._make_async = functools.partial(
            AsyncPostgresInboxStore, conninfo, schema=schema, consumer=consumer, pool_size=pool_size
        )
        self._async: AsyncPostgresInboxStore | None = None
        self._making = threading.Lock()

    def for_async(self) -> InboxStore:
        """See :meth:`kinbox.core.inbox.AsyncCapable.for_async` (made on first call)."""
        with self._making:
            if self._async is None:
                self._async = self._make_async()
            return self._async

    def close(self) -> None:
        """Close the sync pool, then the async store (its pool, then its loop)."""
        try:
            super().close()
        finally:
            if self._async is not None:
                self._async.close()
