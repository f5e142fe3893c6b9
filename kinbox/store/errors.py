"""Whose fault a PostgreSQL error is: the server's, a conflict's or the event's; one classification.

Every psycopg error kinbox sees is judged by :func:`blame`, wherever it was
raised (kinbox's own statements and COMMIT through :func:`translate`, what a
handler raised through :func:`behind`), from evidence about the server and
the connection the statement ran on, never from the Python type alone:

*Outage* — the server or the connection is gone. The batch rolls back, no try
is counted, the partition waits and is retried with backoff, for as long as
it takes:

- the connection is broken (psycopg lost it: ``conn.broken``), whatever was
  raised, also during COMMIT (then whether it committed is unknown: see
  :mod:`kinbox.apply.batch`);
- no connection could be had: a failed connect, the pool's timeout (an
  ``OperationalError`` or ``InterfaceError`` raised with no connection in hand);
- class ``08`` connection exception;
- ``57P01`` to ``57P05``: admin or crash shutdown, cannot connect now, database
  dropped, idle-session timeout (the rest of class ``57`` is below);
- class ``53`` insufficient resources (disk full, out of memory, too many
  connections), except ``53400``: PostgreSQL raises it for ``temp_file_limit``,
  a limit of the session that one statement's work exceeds, so it is the
  statement's;
- ``25006`` read-only transaction, when the server refuses writes to every
  transaction: it reports ``in_hot_standby`` or ``default_transaction_read_only``
  on (a failover left the connection on a standby; an operator stopped
  writes), or is too old (< 14) to report them. On a writable primary the
  handler made its own transaction read-only: the event's.

*Conflict* — ``40001`` serialization failure, ``40P01`` deadlock: the server
aborted this transaction to let another one through. Not the event's fault,
and trying again usually succeeds, but it may not ever: the event's
transaction is retried at once a bounded number of times in a row, without
counting a try, and then the conflict counts as one
(:data:`kinbox.apply.narrow.CONFLICT_RETRIES`). The rest of class ``40``
(``40002`` integrity violation, ``40003`` completion unknown) is the event's.

*Wait* — ``55P03`` lock not available (``lock_timeout``) and ``57014`` query
cancelled (``statement_timeout``, ``pg_cancel_backend``), in kinbox's **own**
statements only (the claim, the dead-letter bookkeeping). The claim waits
only while another transaction holds the same ``processed_events`` row — the
previous owner of the partition during a rebalance, still finishing its batch.
That is never the event's fault, and no verdict is possible until that
transaction ends: it may still commit the event. So it waits, unbounded,
saying so in the log at every try. In a **handler's** statements, or at
COMMIT, they are the event's: a poison event can make its handler wait or run
too long every time, and must not hold its partition forever.

*The event's* — everything else, wherever the handler's transaction raised
it, and whether the handler let it through or caught it: a try of the event,
counted towards ``max_attempts``. That is data exceptions (class ``22``: a
value too long for ``varchar(n)``, an untranslatable character, NUL),
integrity violations (class ``23``, also raised by a deferred constraint at
COMMIT), ``25P02`` in failed transaction and psycopg's ``PipelineAborted``
(a statement failed earlier and the error was caught), ``54000`` program limit
exceeded, errors a user's trigger raises, programming errors (class ``42``),
class ``58`` system errors and ``XX001``/``XX002`` corrupted data (a handler
can meet a missing file or a damaged page that only its event's rows touch;
a damage every event meets fails every handler, and the circuit breaker
pauses the member before the topic is emptied), and what psycopg refuses on
a healthy connection with no SQLSTATE (NUL in text, COPY in pipeline mode,
an operation on a connection the handler closed itself). See
:mod:`kinbox.apply.narrow` for how the event is found when the statement that
failed cannot say which one it was.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

import psycopg

from kinbox.core.describe import describe
from kinbox.core.errors import ConflictError, StoreError

Blame = Literal["outage", "conflict", "wait", "event"]
"""Whose fault an error is: see the module's docstring."""

_OUTAGE_CLASSES = frozenset({"08", "53"})
_OUTAGE_STATES = frozenset({"57P01", "57P02", "57P03", "57P04", "57P05"})
_THE_STATEMENTS = frozenset({"53400"})  # temp_file_limit: one statement's work
_CONFLICTS = frozenset({"40001", "40P01"})
_WAITS = frozenset({"55P03", "57014"})


class Connection(Protocol):
    """What the classification reads of a connection (psycopg's, sync or async, or a fake)."""

    @property
    def broken(self) -> bool:
        """Whether the connection was lost (not closed by a client call)."""


def blame(exc: BaseException, conn: Connection | None = None, *, own: bool = True) -> Blame:
    """Whose fault ``exc`` (a psycopg error) is.

    Args:
        exc: the error.
        conn: the connection the statement ran on; ``None`` when none was
            had (connecting, taking one from the pool).
        own: it was raised by kinbox's own statement (the claim, the
            dead-letter bookkeeping, migrations), not by a handler's or COMMIT.
    """
    if conn is not None and conn.broken:
        return "outage"
    if not isinstance(exc, psycopg.Error):
        return "event"
    state = exc.sqlstate
    if state is None:
        # psycopg's own: without a connection in hand, a failed connect (the
        # pool's timeout is an OperationalError too); on a connection that
        # is not broken, nothing about the server.
        gone = isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
        return "outage" if conn is None and gone else "event"
    if state in _OUTAGE_STATES or (state[:2] in _OUTAGE_CLASSES and state not in _THE_STATEMENTS):
        return "outage"
    if state == "25006" and _refuses_writes(conn):
        return "outage"
    if state in _CONFLICTS:
        return "conflict"
    if own and state in _WAITS:
        return "wait"
    return "event"


def _refuses_writes(conn: Connection | None) -> bool:
    """Whether the server refuses writes to every transaction, as far as it reports."""
    info: Any = getattr(conn, "info", None)
    if info is None:
        return True  # nothing to tell by: as the server would, for every event
    standby = info.parameter_status("in_hot_standby")
    if standby is None:
        return True  # a server before 14 does not report it
    return "on" in (standby, info.parameter_status("default_transaction_read_only"))


def translate(
    exc: BaseException, conn: Connection | None = None, *, own: bool = True, doing: str = ""
) -> StoreError:
    """Return the :class:`StoreError` for a psycopg (or pool) exception.

    A conflict is a :class:`~kinbox.core.errors.ConflictError`; an outage and a
    wait are ``transient``. ``doing`` (what failed, for the message) leads the
    error's own description. Other args: see :func:`blame`.
    """
    verdict = blame(exc, conn, own=own)
    message = f"{doing}: {describe(exc)}" if doing else describe(exc)
    if verdict == "conflict":
        return ConflictError(message)
    return StoreError(message, transient=verdict != "event")


def behind(exc: BaseException, conn: Connection) -> StoreError | None:
    """The database's part in ``exc``, what a handler raised on ``conn``: an outage, a conflict.

    Returns a transient :class:`StoreError` for an outage, a
    :class:`~kinbox.core.errors.ConflictError` for a conflict, or ``None`` when the
    failure is the event's. A handler works on the raw connection, so a
    server restart surfaces as whatever it raises: the psycopg error itself,
    an error chained to it (an ORM's), or anything at all once the
    connection is lost. So the connection is asked first, then every psycopg
    error in the chain, judged as a handler's statement. A
    :class:`StoreError` in the chain is trusted only when no psycopg error
    underlies it (kinbox raised it on its own evidence); one translated from
    psycopg's is judged again here, on the connection's evidence.
    """
    if conn.broken:
        return StoreError(f"the connection was lost: {describe(exc)}", transient=True)
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        cause = current.__cause__ or current.__context__
        if isinstance(current, psycopg.Error):
            verdict = blame(current, conn, own=False)
            if verdict != "event":
                return translate(current, conn, own=False)
        elif isinstance(current, StoreError) and not isinstance(cause, psycopg.Error):
            return current if current.transient else None
        current = cause
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
