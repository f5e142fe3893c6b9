"""The blocking face of psycopg's async objects, so the inbox's one SQL core drives them too.

kinbox's claim, savepoints, dead-letter bookkeeping and COMMIT are written
once, in :mod:`kinbox.store.postgres`, against the part of psycopg's sync API
they use. For async handlers the inbox transaction must run on an
``AsyncConnection`` (taken from an ``AsyncConnectionPool``), because that is
what the handlers get. This module gives those async objects that same sync
API — :class:`SyncPool`, :class:`SyncConnection`, :class:`SyncCursor`, and
the transaction, savepoint and pipeline blocks — each call a coroutine run
on the worker's :class:`~kinbox.store.loop.LoopThread`. So the very same code
issues the very same statements over either kind of connection, and never
two hand-kept copies of the claim and transaction logic exist.

Only what the store touches is bridged; what psycopg computes locally
(``info``, ``pgconn``, ``closed``) is read directly, which is safe because
the loop never uses the connection while the batch thread does (it waits).
Exceptions are psycopg's own, raised unchanged through the bridge, so
:mod:`kinbox.store.errors` classifies them exactly as on a sync connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from types import TracebackType
from typing import Any, Generic, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from kinbox.store.loop import LoopThread

T = TypeVar("T")


class SyncContext(Generic[T]):
    """``with`` over an ``async with`` block: its enter and exit each run on the loop."""

    def __init__(self, loop: LoopThread, context: AbstractAsyncContextManager[T]) -> None:
        self._loop = loop
        self._context = context

    def __enter__(self) -> T:
        return self._loop.run(self._context.__aenter__())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return self._loop.run(self._context.__aexit__(exc_type, exc, tb))


class SyncCursor:
    """A cursor's results, read on the loop (``fetchall``, ``fetchone``, ``rowcount``)."""

    def __init__(self, loop: LoopThread, cursor: psycopg.AsyncCursor[Any]) -> None:
        self._loop = loop
        self._cursor = cursor

    def fetchall(self) -> list[Any]:
        """All the rows of the current result."""
        return self._loop.run(self._cursor.fetchall())

    def fetchone(self) -> Any:
        """The next row, or ``None``."""
        return self._loop.run(self._cursor.fetchone())

    @property
    def rowcount(self) -> int:
        """Rows the last statement touched."""
        return self._cursor.rowcount


class SyncPipeline:
    """A pipeline block's ``sync()``: wait for every statement sent so far."""

    def __init__(self, loop: LoopThread, pipeline: psycopg.AsyncPipeline) -> None:
        self._loop = loop
        self._pipeline = pipeline

    def sync(self) -> None:
        """See ``psycopg.Pipeline.sync``."""
        self._loop.run(self._pipeline.sync())


class SyncConnection:
    """An ``AsyncConnection`` with the blocking API the inbox store uses.

    Args:
        loop: the loop that owns ``connection``.
        connection: the connection, which async handlers receive as it is
            (:attr:`async_connection`).
    """

    def __init__(self, loop: LoopThread, connection: psycopg.AsyncConnection[Any]) -> None:
        self._loop = loop
        self.async_connection = connection
        """The connection itself, for async handlers."""

    @property
    def loop(self) -> LoopThread:
        """The loop the connection lives on."""
        return self._loop

    def execute(
        self, query: Any, params: Sequence[Any] | None = None, *, prepare: bool | None = None
    ) -> SyncCursor:
        """Run one statement; its results are read through the returned cursor."""
        cursor = self._loop.run(self.async_connection.execute(query, params, prepare=prepare))
        return SyncCursor(self._loop, cursor)

    def transaction(self) -> SyncContext[Any]:
        """A transaction block (a savepoint when one is open): see ``Connection.transaction``."""
        return SyncContext(self._loop, self.async_connection.transaction())

    @contextmanager
    def pipeline(self) -> Iterator[SyncPipeline]:
        """A pipeline-mode block: see ``Connection.pipeline``."""
        with SyncContext(self._loop, self.async_connection.pipeline()) as pipeline:
            yield SyncPipeline(self._loop, pipeline)

    def rollback(self) -> None:
        """Roll the current transaction back."""
        self._loop.run(self.async_connection.rollback())

    @property
    def info(self) -> psycopg.ConnectionInfo:
        """See ``Connection.info`` (computed locally)."""
        return self.async_connection.info

    @property
    def pgconn(self) -> Any:
        """The libpq connection (its transaction status is tracked locally)."""
        return self.async_connection.pgconn

    @property
    def autocommit(self) -> bool:
        """See ``Connection.autocommit``."""
        return self.async_connection.autocommit

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        self._loop.run(self.async_connection.set_autocommit(value))

    @property
    def closed(self) -> bool:
        """See ``Connection.closed``."""
        return self.async_connection.closed

    @property
    def broken(self) -> bool:
        """See ``Connection.broken``."""
        return self.async_connection.broken


class SyncPool:
    """An ``AsyncConnectionPool`` on ``loop`` with the blocking API of ``ConnectionPool``.

    Args:
        loop: where the pool, its connections and its background tasks live.
        make: builds the pool (called on the loop: asyncio's objects belong
            to the loop they are made on); it must be made with ``open=False``.
    """

    def __init__(
        self,
        loop: LoopThread,
        make: Callable[[], AsyncConnectionPool[psycopg.AsyncConnection[Any]]],
    ) -> None:
        self._loop = loop
        self._pool = loop.run(_made(make))

    def open(self, wait: bool = False, timeout: float = 30.0) -> None:
        """See ``ConnectionPool.open``."""
        self._loop.run(self._pool.open(wait=wait, timeout=timeout))

    @contextmanager
    def connection(self) -> Iterator[SyncConnection]:
        """A connection of the pool for the block, given back at its end."""
        with SyncContext(self._loop, self._pool.connection()) as connection:
            yield SyncConnection(self._loop, connection)

    def close(self, timeout: float = 5.0) -> None:
        """Close the pool and its connections (nothing happens if the loop is gone)."""
        if self._loop.running:
            self._loop.run(self._pool.close(timeout=timeout))


async def _made(make: Callable[[], T]) -> T:
    return make()
