"""Which PostgreSQL errors are an outage and which are the event's: one classification.

Every psycopg error kinbox sees is sorted by :func:`transient`, wherever it
was raised (kinbox's own statements through :func:`translate`, a handler's
through :func:`transient_cause`, COMMIT through the store):

*Transient* — the database, not the event. The batch rolls back, no try is
counted, the partition waits and is retried with backoff:

- no SQLSTATE on an ``OperationalError``, or any ``InterfaceError``: the
  connection failed or was lost on the client side (also during COMMIT);
- class ``08`` connection exception;
- class ``40`` transaction rollback (``40001`` serialization failure,
  ``40P01`` deadlock, ``40003`` completion unknown), except ``40002``,
  an integrity violation;
- class ``53`` insufficient resources (disk full, out of memory, too many
  connections, configuration limit);
- class ``57`` operator intervention (admin/crash shutdown, cannot connect
  now, database dropped, idle-session timeout), except ``57014``, below;
- class ``58`` system error (I/O error, a file missing);
- ``XX001``/``XX002`` data or index corrupted: every event touching it would
  fail, so they must wait for the operator rather than be dead-lettered;
- ``25006`` read-only transaction: connected to a standby (failover).

*Waits* — ``55P03`` lock not available (``lock_timeout``) and ``57014``
query cancelled (``statement_timeout``, or ``pg_cancel_backend``). They depend
on who waited:

- in kinbox's **own** statements (the claim, the dead-letter bookkeeping)
  they are transient. The claim waits only when another transaction holds
  the same ``processed_events`` row — the previous owner of the partition
  during a rebalance, still finishing its batch. That is never the event's
  fault, and must never get it dead-lettered.
- in a **handler's** statements, or at COMMIT (a deferred constraint's
  check), they count as a try: a poison event can make its handler wait or
  run too long every time, and must not hold its partition forever.

*Everything else* is not transient: data exceptions (class ``22``: a value
too long for ``varchar(n)``, an untranslatable character, NUL), integrity
violations (class ``23``, also raised by a deferred constraint at COMMIT),
``54000`` program limit exceeded (an index row over the btree limit),
errors a user's trigger raises, programming errors (class ``42``), and
client-side refusals with no SQLSTATE (psycopg will not send NUL in text).
Raised by a handler's statement or at COMMIT, such an error is a failure of
the event and counts as a try (see :mod:`kinbox.apply.narrow` for how the event is
found when COMMIT cannot say which one it was). Raised by kinbox's own
statements it is narrowed down the same way: see :mod:`kinbox.apply.narrow`.
"""

from __future__ import annotations

import psycopg

from kinbox.describe import describe
from kinbox.errors import StoreError

_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})
_NOT_TRANSIENT = frozenset({"40002", "57014"})
_TRANSIENT_STATES = frozenset({"XX001", "XX002", "25006"})
_WAITS = frozenset({"55P03", "57014"})


def transient(exc: BaseException, *, own: bool) -> bool:
    """Whether ``exc`` (a psycopg error) comes from the database rather than the event.

    Args:
        exc: the error.
        own: it was raised by kinbox's own statement (the claim, the
            dead-letter bookkeeping, migrations), not by a handler's or COMMIT.
    """
    if isinstance(exc, psycopg.InterfaceError):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:
        return isinstance(exc, psycopg.OperationalError)
    if own and state in _WAITS:
        return True
    if state in _NOT_TRANSIENT:
        return False
    return state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES


def translate(exc: BaseException, *, own: bool = True) -> StoreError:
    """Return the :class:`StoreError` for a psycopg (or pool) exception.

    ``own``: see :func:`transient`; false for a handler's statements and COMMIT.
    """
    return StoreError(describe(exc), transient=transient(exc, own=own))


def transient_cause(exc: BaseException) -> StoreError | None:
    """Return a transient :class:`StoreError` if ``exc`` comes from the database going away.

    A handler works on the raw psycopg connection, so a server restart or a
    killed backend surfaces as whatever the handler raises, usually the
    psycopg error itself or an error chained to it. Such a failure says
    nothing about the event: it must be retried without counting towards the
    event's ``max_attempts``, never dead-lettered. A handler's statements are
    not kinbox's own: a lock or statement timeout there counts as a try.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, StoreError):
            return current if current.transient else None
        if isinstance(current, psycopg.Error) and transient(current, own=False):
            return translate(current, own=False)
        current = current.__cause__ or current.__context__
    return None


def left_aborted() -> StoreError:
    """The error for a handler that returned normally but left its transaction aborted.

    It caught a database error and carried on; the failure is its event's
    (not transient), never the next handler's, whose first statement would fail.
    """
    return StoreError(
        "InFailedSqlTransaction: the handler returned normally but left the "
        "transaction aborted (did it catch a database error and carry on?)",
        transient=False,
    )


def aborted_at_commit() -> StoreError:
    """The error for a COMMIT of a transaction a failed statement left aborted.

    PostgreSQL would answer such a COMMIT with ROLLBACK, and psycopg says
    nothing: the batch would count as committed while none of it is. So
    kinbox raises this instead; it is a refused COMMIT, pinned on its event
    as any other (:mod:`kinbox.apply.narrow`).
    """
    return StoreError(
        "InFailedSqlTransaction: COMMIT of an aborted transaction (a statement failed and "
        "its error was caught): PostgreSQL would roll it back",
        transient=False,
    )
