"""Translation of psycopg's exceptions into :class:`~kinbox.errors.StoreError`.

:func:`translate` is used at every place kinbox itself talks to PostgreSQL;
:func:`transient_cause` looks at what a *handler* raised, which may be a
psycopg error, or an error chained to one, from the database going away.
"""

from __future__ import annotations

import psycopg
from psycopg import errors as pg_errors

from kinbox.errors import StoreError

_TRANSIENT: tuple[type[Exception], ...] = (
    # Connection refused/lost, server restart (AdminShutdown), lock/statement
    # timeouts, too many connections: all OperationalError in psycopg.
    psycopg.OperationalError,
    # Serialization failure and deadlock are TransactionRollback (also an
    # OperationalError); listed for the reader: the server asks for a retry.
    pg_errors.SerializationFailure,
    pg_errors.DeadlockDetected,
    # "the connection is closed": the pool replaces it on the next checkout.
    psycopg.InterfaceError,
)


def translate(exc: BaseException) -> StoreError:
    """Return the :class:`StoreError` for a psycopg (or pool) exception."""
    return StoreError(f"{type(exc).__name__}: {exc}".strip(), transient=isinstance(exc, _TRANSIENT))


def transient_cause(exc: BaseException) -> StoreError | None:
    """Return a transient :class:`StoreError` if ``exc`` comes from the database going away.

    A handler works on the raw psycopg connection, so a server restart or a
    killed backend surfaces as whatever the handler raises, usually the
    psycopg error itself or an error chained to it. Such a failure says
    nothing about the event: it must be retried without counting towards the
    event's ``max_attempts``, never dead-lettered.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, StoreError):
            return current if current.transient else None
        if isinstance(current, psycopg.Error) and _outage(current):
            return translate(current)
        current = current.__cause__ or current.__context__
    return None


# SQLSTATEs that say "the database, not this event": connection exceptions
# (class 08), shutdown/crash (57P01-3), too many connections, and the
# serialization failures the server asks us to retry. A statement timeout or a
# lock timeout is left out on purpose: a poison event can cause those every time.
_OUTAGE_STATES = frozenset({"57P01", "57P02", "57P03", "53300", "40001", "40P01"})


def _outage(exc: psycopg.Error) -> bool:
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _OUTAGE_STATES
