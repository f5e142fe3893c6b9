"""The cursors of the inbox's connections: they note what pipeline mode refuses a handler.

A per-event handler's first pass runs in psycopg's pipeline mode
(:meth:`~kinbox.core.inbox.InboxTransaction.pipelined`), where psycopg refuses
``COPY``, ``cursor.stream()`` and server-side cursors before sending anything.
Such a refusal is kinbox's doing, not the handler's: without the pipeline the
same call works. A handler that lets it through is easy to tell (its
exception), but one that catches it — ``except psycopg.Error`` around a COPY
— would carry on as if its COPY had run, and its event would commit without
it. So every cursor of the inbox's connections notes, on its connection, a
call that the pipeline is about to refuse; :func:`refused` reads the note,
and a pass that made one is redone without the pipeline, whatever the
handler did with the error.

The cursors are psycopg's own classes with that one addition, set on each
connection when the pool makes it (:func:`configure`, :func:`configure_async`),
so a handler's ``tx.cursor()`` is still a ``psycopg.Cursor``. A cursor a
handler builds itself (``psycopg.ClientCursor(tx)``) notes nothing.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg.abc import Query
from psycopg.copy import AsyncCopy, AsyncWriter, Copy, Writer
from psycopg.rows import Row

_OFF = psycopg.pq.PipelineStatus.OFF

# The connections whose pipeline refused a call since their note was forgotten.
_refused: weakref.WeakSet[Any] = weakref.WeakSet()


def _note(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    """Note the cursor's connection if it is in pipeline mode: the call will be refused."""
    if cursor.connection.pgconn.pipeline_status != _OFF:
        _refused.add(cursor.connection)


def refused(connection: object) -> bool:
    """Whether pipeline mode refused a call on ``connection`` since the note was forgotten."""
    return connection in _refused


def forget(connection: object) -> None:
    """Forget ``connection``'s note (a pipelined pass begins or ends)."""
    _refused.discard(connection)


class InboxCursor(psycopg.Cursor[Row]):
    """``psycopg.Cursor``, noting a COPY or a stream that pipeline mode refuses."""

    __slots__ = ()

    @contextmanager
    def copy(
        self, statement: Query, params: Any = None, *, writer: Writer | None = None
    ) -> Iterator[Copy]:
        """See ``psycopg.Cursor.copy``."""
        _note(self)
        with super().copy(statement, params, writer=writer) as copy:
            yield copy

    def stream(
        self, query: Query, params: Any = None, *, binary: bool | None = None, size: int = 1
    ) -> Iterator[Row]:
        """See ``psycopg.Cursor.stream``."""
        _note(self)
        return super().stream(query, params, binary=binary, size=size)


class InboxServerCursor(psycopg.ServerCursor[Row]):
    """``psycopg.ServerCursor``, noting that pipeline mode refuses it."""

    __slots__ = ()

    def execute(
        self, query: Query, params: Any = None, *, binary: bool | None = None, **kwargs: Any
    ) -> InboxServerCursor[Row]:
        """See ``psycopg.ServerCursor.execute``."""
        _note(self)
        return super().execute(query, params, binary=binary, **kwargs)


class AsyncInboxCursor(psycopg.AsyncCursor[Row]):
    """``psycopg.AsyncCursor``, noting a COPY or a stream that pipeline mode refuses."""

    __slots__ = ()

    @asynccontextmanager
    async def copy(
        self, statement: Query, params: Any = None, *, writer: AsyncWriter | None = None
    ) -> AsyncIterator[AsyncCopy]:
        """See ``psycopg.AsyncCursor.copy``."""
        _note(self)
        async with super().copy(statement, params, writer=writer) as copy:
            yield copy

    def stream(
        self, query: Query, params: Any = None, *, binary: bool | None = None, size: int = 1
    ) -> AsyncIterator[Row]:
        """See ``psycopg.AsyncCursor.stream``."""
        _note(self)
        return super().stream(query, params, binary=binary, size=size)


class AsyncInboxServerCursor(psycopg.AsyncServerCursor[Row]):
    """``psycopg.AsyncServerCursor``, noting that pipeline mode refuses it."""

    __slots__ = ()

    async def execute(
        self, query: Query, params: Any = None, *, binary: bool | None = None, **kwargs: Any
    ) -> AsyncInboxServerCursor[Row]:
        """See ``psycopg.AsyncServerCursor.execute``."""
        _note(self)
        return await super().execute(query, params, binary=binary, **kwargs)


def configure(conn: psycopg.Connection[Any]) -> None:
    """Give a new connection of the inbox's pool these cursors (the pool's ``configure``)."""
    conn.cursor_factory = InboxCursor
    conn.server_cursor_factory = InboxServerCursor


async def configure_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """Give a new connection of the async inbox's pool these cursors."""
    conn.cursor_factory = AsyncInboxCursor
    conn.server_cursor_factory = AsyncInboxServerCursor
