"""How the inbox's pool checks a connection before handing it out: no round trip when it can.

psycopg_pool's own check (``ConnectionPool.check_connection``) sends an
empty query, one round trip for every transaction: in a replay, where a
batch is one claim, that was a sixth of a batch's time. A connection that
went back to the pool a moment ago is checked locally instead: an idle
connection has nothing to read, so a socket with something to read means
the server spoke unasked — it terminated the backend (``pg_terminate_backend``,
a shutdown or restart) and closed it — and the connection is dropped for a
fresh one, exactly as the round-trip check would have. A connection idle for
longer than :data:`RECHECK_AFTER` (the server, or something between, may
have dropped it silently) still gets the round trip.
"""

from __future__ import annotations

import select
import time
import weakref
from typing import Any, Literal

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

_Connection = psycopg.Connection[Any] | psycopg.AsyncConnection[Any]

RECHECK_AFTER = 30.0
"""Seconds a connection may sit in the pool before its check costs a round trip."""


class Checkout:
    """The pool's ``check``, and when each connection was last given back.

    (Not through the pool's ``reset`` callback: with one, the pool takes a
    connection back on a worker thread, later, instead of at once.)
    """

    def __init__(self) -> None:
        self._returned: weakref.WeakKeyDictionary[_Connection, float] = weakref.WeakKeyDictionary()

    def given_back(self, conn: _Connection) -> None:
        """Note that ``conn`` goes back to the pool now, idle."""
        self._returned[conn] = time.monotonic()

    def check(self, conn: psycopg.Connection[Any]) -> None:
        """Raise if ``conn`` is not fit to hand out (the pool then takes another).

        Raises:
            psycopg.OperationalError: the connection is closed, or the
                server spoke on it unasked (terminated it).
        """
        verdict = self._look(conn)
        if verdict == "ask":
            ConnectionPool.check_connection(conn)
        elif verdict == "terminated":
            # Closed, so the pool drops it for a new one (an open connection
            # given back would be handed out again).
            conn.close()
            raise _terminated()

    async def check_async(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """:meth:`check` for the async pool (its round trip awaited)."""
        verdict = self._look(conn)
        if verdict == "ask":
            await AsyncConnectionPool.check_connection(conn)
        elif verdict == "terminated":
            await conn.close()
            raise _terminated()

    def _look(self, conn: _Connection) -> Literal["fit", "ask", "terminated"]:
        """What can be told of ``conn`` locally; ``ask``: only a round trip can tell.

        Raises:
            psycopg.OperationalError: it is closed.
        """
        returned = self._returned.get(conn)
        if returned is None or time.monotonic() - returned > RECHECK_AFTER:
            return "ask"
        if conn.closed or conn.broken:
            raise psycopg.OperationalError("the connection is closed")
        try:
            readable, _, _ = select.select([conn.fileno()], [], [], 0)
        except (OSError, ValueError):  # a descriptor select() cannot take
            return "ask"
        return "terminated" if readable else "fit"


def _terminated() -> psycopg.OperationalError:
    return psycopg.OperationalError(
        "the server sent something on an idle connection: it terminated it"
    )
