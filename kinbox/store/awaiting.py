"""The inbox store of async handlers: the same SQL, on an ``AsyncConnection`` of an async pool.

:class:`AsyncPostgresInboxStore` is :class:`~kinbox.store.postgres.PostgresInboxStore`
with another pool: an ``AsyncConnectionPool`` on an event loop of its own
(:class:`~kinbox.store.loop.LoopThread`), seen through :mod:`kinbox.store.bridge`.
Its transactions are the sync store's own: the claim, the savepoints, the
dead-letter bookkeeping and COMMIT are the same code issuing the same
statements, over either connection. Two things differ:

- handlers receive the ``AsyncConnection`` itself (``tx.connection``);
- ``tx.wait(awaitable)`` runs a handler's coroutine on the loop while the
  batch thread waits, so the connection has one user at a time.

:class:`MixedInboxStore` is the store a worker runs with: sync transactions
itself, and, from :meth:`~MixedInboxStore.for_async`, an
:class:`AsyncPostgresInboxStore` over the same tables for the routes whose
handler is ``async def`` (asked once, when the batch code is set up; an app
with no async handler never starts the loop). Closing it closes both, after
the worker's last offsets are committed: the pools, then the loop.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import psycopg
from psycopg_pool import AsyncConnectionPool

from kinbox.core.inbox import InboxStore, InboxTransaction, Invoke
from kinbox.store.bridge import SyncConnection, SyncPool
from kinbox.store.cursors import configure_async
from kinbox.store.errors import translate
from kinbox.store.loop import LoopThread, awaited
from kinbox.store.postgres import PostgresInboxStore, _PostgresTransaction

T = TypeVar("T")


class AsyncPostgresInboxStore(PostgresInboxStore):
    """An inbox store whose transactions run on an ``AsyncConnection``, for async handlers.

    Args: as :class:`~kinbox.store.postgres.PostgresInboxStore`; at most
    ``pool_size`` connections, in an ``AsyncConnectionPool``. Its loop thread
    starts now; its pool opens with the first transaction.
    """

    def __init__(self, conninfo: str, *, schema: str, consumer: str, pool_size: int = 2) -> None:
        super().__init__(conninfo, schema=schema, consumer=consumer, pool_size=pool_size)
        self._loop = LoopThread("kinbox-async-handlers")
        self._opened = False
        self._opening = threading.Lock()

        def make() -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
            # As the sync pool's: the check turns a connection a server
            # restart killed into a fresh one instead of a failed batch.
            return AsyncConnectionPool(
                conninfo,
                min_size=1,
                max_size=max(1, pool_size),
                open=False,
                check=AsyncConnectionPool.check_connection,
                configure=configure_async,
                name="kinbox-inbox-async",
            )

        # In place of the sync pool the parent made (unopened: it holds
        # nothing): the parent's code takes connections from this one.
        self._pool = cast(Any, SyncPool(self._loop, make))

    def open(self, timeout: float = 30.0) -> None:
        """Open the pool, without waiting for a connection (idempotent).

        The tables were checked when the worker's sync store opened; a
        database that cannot be reached now is met by the first transaction,
        as any outage is: the batch waits.
        """
        with self._opening:
            if not self._opened:
                self._pool.open(wait=False, timeout=timeout)
                self._opened = True

    @contextmanager
    def transaction(self) -> Iterator[InboxTransaction]:
        """See :meth:`~kinbox.core.inbox.InboxStore.transaction`; the first one opens the pool."""
        if not self._opened:
            try:
                self.open()
            except psycopg.Error as exc:
                raise translate(exc) from exc
        with super().transaction() as tx:
            yield tx

    def close(self) -> None:
        """Close the pool, then stop the loop."""
        try:
            if self._opened:
                self._pool.close()
        finally:
            self._loop.stop()

    def sessions(self, session_class: type) -> Callable[[Invoke], Invoke]:
        """``AsyncSession`` s (:mod:`kinbox.store.orm_async`), for async handlers."""
        from kinbox.store.orm_async import AsyncSessions  # loaded only for handlers that ask

        return AsyncSessions(session_class).around

    @property
    def _transaction_type(self) -> type[_PostgresTransaction]:
        return _AwaitingTransaction


class _AwaitingTransaction(_PostgresTransaction):
    """The inbox transaction on a :class:`SyncConnection`; handlers get the async one."""

    @property
    def connection(self) -> psycopg.AsyncConnection[Any]:
        return self.bridged.async_connection

    @property
    def bridged(self) -> SyncConnection:
        """The same connection with a blocking API, for code that is not async."""
        return cast(SyncConnection, self._conn)  # what the async pool hands out

    def wait(self, awaitable: Awaitable[T]) -> T:
        """See :meth:`kinbox.core.inbox.Awaiting.wait`."""
        return self.bridged.loop.run(awaited(awaitable))

    @property
    def _driver(self) -> object:
        return self.bridged.async_connection


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
