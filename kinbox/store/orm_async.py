"""A SQLAlchemy ``AsyncSession`` inside the inbox transaction, for ``async def`` handlers.

The async twin of :mod:`kinbox.store.orm`, bound the same way over the
``AsyncConnection`` kinbox holds for the transaction (see there for why each
piece is as it is): one ``AsyncEngine`` per connection of the async pool,
made with ``create_async_engine(async_creator=...)`` and a ``StaticPool``
that never closes nor resets it; the dialect is SQLAlchemy's async psycopg
dialect with kinbox's refusals (:class:`InboxAsyncDialect`: COMMIT raises
:class:`~kinbox.core.errors.TransactionControlError`, a ROLLBACK inside the
handler too); the session joins with ``join_transaction_mode="create_savepoint"``,
so ``await session.commit()`` only releases its savepoint, and kinbox flushes
and releases it when the handler returns. ``pip install 'kinbox[sqlalchemy]'``
(SQLAlchemy's asyncio extra: greenlet).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, cast

import psycopg
from sqlalchemy import URL, Dialect
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.psycopg import PGDialectAsync_psycopg
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.pool import StaticPool

from kinbox.core.inbox import Invoke
from kinbox.store.orm import IN_HANDLER, EngineCache, InboxDialect

_DIALECT = "kinbox_psycopg_async"


class InboxAsyncDialect(InboxDialect, PGDialectAsync_psycopg):
    """SQLAlchemy's async psycopg dialect on a connection whose transaction kinbox owns."""

    supports_statement_cache = True

    @classmethod
    def get_async_dialect_cls(cls, url: URL) -> type[Dialect]:
        """Itself: the psycopg dialect would answer with the stock async dialect instead."""
        return cls


registry.register(f"postgresql.{_DIALECT}", __name__, "InboxAsyncDialect")


class AsyncSessions:
    """Hands out ``AsyncSession`` s of ``session_class`` bound to the inbox transaction."""

    def __init__(self, session_class: type[AsyncSession]) -> None:
        self._session_class = session_class

    def around(self, invoke: Invoke) -> Invoke:
        """``invoke`` (which returns a coroutine) with a session in its last argument."""

        async def with_session(payload: object, event: object, tx: Any, _: Any) -> object:
            connection = await _engines.get(tx).connect()
            try:
                await connection.begin()  # sends nothing: the inbox transaction is open
                session = self._session_class(
                    bind=connection, join_transaction_mode="create_savepoint"
                )
                token = IN_HANDLER.set(True)
                try:
                    result = await cast(Awaitable[object], invoke(payload, event, tx, session))
                finally:
                    IN_HANDLER.reset(token)
                # Flush what is pending and release the session's savepoint:
                # the work stays in the inbox transaction and commits with it.
                await session.commit()
                await session.close()
                return result
            finally:
                await connection.close()  # sends nothing (InboxDialect.do_rollback)

        return with_session


def _engine(connection: psycopg.AsyncConnection[Any]) -> AsyncEngine:
    async def creator() -> psycopg.AsyncConnection[Any]:
        return connection

    return create_async_engine(
        f"postgresql+{_DIALECT}://",
        async_creator=creator,
        poolclass=StaticPool,
        pool_reset_on_return=None,
    )


def _dispose(engine: AsyncEngine) -> None:
    # The pool's close is a no-op on kinbox's connection (do_close): no I/O.
    engine.sync_engine.dispose()


_engines: EngineCache[psycopg.AsyncConnection[Any], AsyncEngine] = EngineCache(_engine, _dispose)
