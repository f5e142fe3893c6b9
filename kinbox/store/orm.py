"""A SQLAlchemy ``Session`` inside the inbox transaction, on the very connection kinbox holds.

A handler with a parameter annotated ``Session`` (``sqlalchemy.orm.Session``
or a subclass) gets a session whose statements run on the psycopg connection
of the inbox transaction: the team's ORM models and repositories work
unchanged, and what they write commits together with the event's claim, or
not at all. ``pip install 'kinbox[sqlalchemy]'``.

How it is bound, with SQLAlchemy's own extension points only:

- One ``Engine`` per psycopg connection of kinbox's pool, made when that
  connection first serves such a handler: ``create_engine(creator=...)``
  hands SQLAlchemy that very connection, through a ``StaticPool`` (which
  never closes it) with ``pool_reset_on_return=None`` (which never resets it).
- Its dialect is SQLAlchemy's psycopg dialect, except that the transaction
  belongs to kinbox (:class:`InboxDialect`): SQLAlchemy never issues BEGIN
  (its psycopg dialect never does: the DBAPI begins implicitly, and kinbox
  has begun already), a COMMIT it would send raises
  :class:`~kinbox.core.errors.TransactionControlError`, a ROLLBACK is a no-op when
  SQLAlchemy only tidies up (after its first-connect checks, when its
  ``Connection`` closes) and raises inside a handler, and it never closes
  the connection.
- The session joins that transaction with
  ``join_transaction_mode="create_savepoint"``, SQLAlchemy's recipe for a
  session inside a transaction someone else owns: it works in a savepoint of
  its own. ``session.commit()`` in a handler is harmless — it flushes and
  releases that savepoint, and the work commits when kinbox commits the
  batch (a later failure still takes it back); ``session.rollback()`` undoes
  what the session did in this call, and the handler may go on. When the
  handler returns, kinbox flushes the session and releases its savepoint, so
  a database error of the flush is a failure of this event; when it raises,
  kinbox issues nothing more (the inbox transaction's rollback, or kinbox's
  own savepoint, takes the work back).

The price: a ``SAVEPOINT`` and a ``RELEASE`` per call that uses the session
(two round trips), and SQLAlchemy's own per-call bookkeeping, on top of the
ORM's statements. kinbox's savepoints (the careful pass) wrap the session's,
so redoing a batch after a poison event works unchanged.

An ``async def`` handler's parameter annotated ``AsyncSession`` gets the same
binding over its ``AsyncConnection`` (:mod:`kinbox.store.orm_async`):
``create_async_engine(async_creator=...)`` and the async flavour of this
dialect, with the same refusals. :func:`kinbox.params.signature.parameters_of`
refuses an ``AsyncSession`` on a sync handler and a ``Session`` on an async one.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import psycopg
from sqlalchemy import Engine, create_engine
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from kinbox.core.errors import TransactionControlError
from kinbox.core.inbox import Invoke

IN_HANDLER = contextvars.ContextVar("kinbox_in_handler", default=False)
"""True while a handler runs: a ROLLBACK that SQLAlchemy would send then comes from it."""

_DIALECT = "kinbox_psycopg"


class InboxDialect(PGDialect_psycopg):
    """SQLAlchemy's psycopg dialect on a connection whose transaction kinbox owns."""

    supports_statement_cache = True

    def do_commit(self, dbapi_connection: Any) -> None:
        """Refuse: kinbox commits the handler's work with the event's claim."""
        raise TransactionControlError(
            "a handler cannot commit the inbox transaction: kinbox commits the handler's work "
            "together with the event's claim once the batch succeeds (session.commit() is fine: "
            "it only releases the session's savepoint)"
        )

    def do_rollback(self, dbapi_connection: Any) -> None:
        """Refuse inside a handler; elsewhere SQLAlchemy only tidies up, and nothing is sent."""
        if IN_HANDLER.get():
            raise TransactionControlError(
                "a handler cannot roll back the inbox transaction: raise an exception to undo "
                "the event's work (session.rollback() is fine: it undoes the session's own work)"
            )

    def do_close(self, dbapi_connection: Any) -> None:
        """Leave the connection open: it belongs to kinbox's pool."""

    def do_terminate(self, dbapi_connection: Any) -> None:
        """Leave the connection open: it belongs to kinbox's pool."""


registry.register(f"postgresql.{_DIALECT}", __name__, "InboxDialect")


class Sessions:
    """Hands out sessions of ``session_class`` bound to the inbox transaction, one per call."""

    def __init__(self, session_class: type[Session]) -> None:
        self._session_class = session_class

    def around(self, invoke: Invoke) -> Invoke:
        """``invoke`` with a session in its last argument, over the call's connection."""

        def with_session(payload: object, event: object, tx: Any, _: Any) -> object:
            connection = engine_for(tx).connect()
            try:
                connection.begin()  # sends nothing: the inbox transaction is open already
                session = self._session_class(
                    bind=connection, join_transaction_mode="create_savepoint"
                )
                token = IN_HANDLER.set(True)
                try:
                    result = invoke(payload, event, tx, session)
                finally:
                    IN_HANDLER.reset(token)
                # Flush what is pending and release the session's savepoint:
                # the work stays in the inbox transaction and commits with it.
                session.commit()
                session.close()
                return result
            finally:
                # Sends nothing (see InboxDialect.do_rollback). On an exception
                # the session is left as it is: kinbox's rollback takes the
                # work back, and no statement can fail again over the cause.
                connection.close()

        return with_session


class _Closable(Protocol):
    @property
    def closed(self) -> bool: ...


C = TypeVar("C", bound=_Closable)
E = TypeVar("E")


class EngineCache(Generic[C, E]):
    """One engine per connection of kinbox's pool, made on first use, forgotten once it closes.

    Args:
        make: the engine over one connection.
        dispose: releases an engine whose connection kinbox's pool dropped.
    """

    def __init__(self, make: Callable[[C], E], dispose: Callable[[E], None]) -> None:
        self._make = make
        self._dispose = dispose
        self._engines: dict[int, tuple[C, E]] = {}
        self._lock = threading.Lock()

    def get(self, connection: C) -> E:
        """The engine over ``connection``."""
        entry = self._engines.get(id(connection))
        if entry is not None and entry[0] is connection:
            return entry[1]
        with self._lock:
            # A connection kinbox's pool dropped (after an outage) is closed:
            # forget its engine, so the cache holds only the pool's connections.
            for key, (held, engine) in list(self._engines.items()):
                if held.closed or held is connection:
                    self._dispose(engine)
                    del self._engines[key]
            engine = self._make(connection)
            self._engines[id(connection)] = (connection, engine)
            return engine


def _engine(connection: psycopg.Connection[Any]) -> Engine:
    return create_engine(
        f"postgresql+{_DIALECT}://",
        creator=lambda: connection,
        poolclass=StaticPool,
        pool_reset_on_return=None,
    )


_engines: EngineCache[psycopg.Connection[Any], Engine] = EngineCache(_engine, Engine.dispose)


def engine_for(connection: psycopg.Connection[Any]) -> Engine:
    """The Engine over ``connection`` (made on first use, forgotten once it is closed)."""
    return _engines.get(connection)
