"""The inbox store seam, free of any driver: what the batch processor needs from a database.

:class:`InboxStore` opens :class:`InboxTransaction` s, in which the batch
claims event ids, runs handlers (optimistically or under savepoints) and
records dead letters. This module imports no database driver, so the engine
loads no psycopg: :class:`~kinbox.store.postgres.PostgresInboxStore` is the
real implementation and :mod:`kinbox.testing` has a fake. Both are checked by
one contract suite (``tests/contract``).

The engine hands a store the body of a transaction as a program
(:mod:`kinbox.core.steps`, :meth:`InboxStore.run`); a store whose
transactions are :class:`InboxTransaction` s runs it with :func:`drive`.

The async side: an ``async def`` handler's kind (:mod:`kinbox.apply.kinds`)
asks the worker's store for the same inbox on an async connection
(:class:`AsyncCapable`, once, when the batch code is set up), which runs
the same programs and awaits the handler's calls.
:class:`~kinbox.store.awaiting.MixedInboxStore` is the real implementation,
:class:`~kinbox.testing.FakeStore` a fake.

ORM sessions: a handler that takes a SQLAlchemy session says so when it is
registered (:class:`~kinbox.params.wrap.Prepared`); the store whose
transactions it runs in binds the session to their connection
(:class:`SessionCapable`, asked once, when the batch code is set up).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from kinbox.core.errors import ConfigurationError
from kinbox.core.steps import (
    Call,
    CheckDeferred,
    CheckReused,
    Claim,
    DeadLetterRow,
    OpenPipeline,
    Park,
    ParkingState,
    Program,
    Step,
    Stepper,
    SyncPipeline,
)

if TYPE_CHECKING:
    from kinbox.core.errors import ConflictError, StoreError
    from kinbox.core.event import Event
    from kinbox.core.parking import KeyState
    from kinbox.core.reuse import Sighting

T = TypeVar("T")


class InboxTransaction(Protocol):
    """One open inbox transaction, on the calling thread: what :func:`drive` runs steps on."""

    @property
    def connection(self) -> Any:
        """The object handlers receive as ``tx`` (a psycopg ``Connection``)."""

    def claim(self, events: Sequence[Event], reclaim: Collection[str] = ()) -> list[Event]:
        """Record ``events`` as processed for this consumer; return the fresh ones.

        Fresh means: not recorded before (by any earlier transaction) and the
        first of its id within ``events``. An id in ``reclaim`` (a record
        re-published by ``kinbox dlq replay``) is also fresh when its row is
        ``dead_lettered``: the row becomes ``applied`` again. The order of
        ``events`` is kept.

        Raises:
            StoreError: ``transient`` unless PostgreSQL (or psycopg) refused
                something in the statement, such as an id it cannot store.
        """

    def reused(self, events: Sequence[Event]) -> list[Sighting]:
        """Record those of ``events`` whose payload differs from their id's claimed row's.

        ``events`` are duplicates the last claim dropped. One is reused when
        its row holds a payload digest (:func:`~kinbox.core.reuse.payload_digest`)
        and it differs from the event's; rows claimed before digests were
        kept have none, and never report. Each reuse is recorded once per
        record (a redelivery of the same record is not new), in this
        transaction; the result is the new ones.

        Raises:
            StoreError: as :meth:`claim` does.
        """

    def dead_letter(self, event: Event, reason: str) -> None:
        """Set the claimed row of ``event`` to ``dead_lettered`` with ``reason``.

        ``reason`` may hold any text; the store escapes what the database
        cannot hold.
        """

    def parking_state(self, topic: str, keys: Collection[bytes]) -> dict[bytes, KeyState]:
        """Which of ``keys`` of ``topic`` are blocked for this consumer, and how.

        Locks their rows until the transaction ends, so a release or a
        discard waits for it, and it for them.
        """

    def park(self, step: Park) -> None:
        """Do what ``step`` says, in this transaction (:class:`~kinbox.core.steps.Park`).

        Parked events' rows become ``parked``, with the record kept; a
        blocked key's row names its dead letter (a released key is blocked
        again); unparked events' records go; a freed key's row goes if no
        event of it is parked any more.
        """

    def check_deferred(self) -> None:
        """Run now the checks COMMIT would run: deferred constraints and triggers.

        Raises:
            StoreError: as COMMIT would (judged as a handler's statement).
        """

    def savepoint(self) -> AbstractContextManager[None]:
        """A nested transaction: an exception inside rolls back only its work.

        Database errors inside (the handler's) are translated to
        :class:`~kinbox.core.errors.StoreError`, transient only for an outage or a
        conflict (:func:`kinbox.store.errors.blame` with ``own=False``).

        Raises:
            StoreError: also when the block ends normally but left the
                transaction aborted (a handler swallowed a database error); its
                work is rolled back all the same and the transaction goes on.
        """

    def unguarded(self) -> AbstractContextManager[None]:
        """Handler code without a savepoint: cheaper, but a failure spoils the transaction.

        Database errors inside are translated as in :meth:`savepoint`.

        Raises:
            StoreError: also when the block ends normally but left the
                transaction aborted (a handler swallowed a database error),
                so the failure is blamed on that handler, never on a later one.
        """

    def pipelined(self) -> AbstractContextManager[Callable[[], bool]]:
        """Handler code whose statements are sent without waiting for each result.

        Many statements then cost one round trip (psycopg's pipeline mode),
        but the database reports a failed statement only when its result is
        read: during a later handler, or as the block ends. So a database
        error raised inside cannot be pinned on the handler running when it
        was raised; the caller rolls back and redoes the batch without the
        pipeline. A handler that reads a result (``fetchone``) still gets it:
        the read waits for it.

        Yields ``sync()``: waits for every statement sent so far and says
        whether all of them succeeded (the transaction is not aborted) and
        the pipeline refused no call (a COPY, say, which works without it) —
        then an exception a handler just raised is its own.

        Raises:
            StoreError: translated as in :meth:`savepoint`, also when the
                block ends with the transaction aborted, or after the
                pipeline refused a call that a handler then caught.
        """

    def outage(self, exc: BaseException) -> StoreError | None:
        """The database outage behind ``exc`` (what a handler raised), or ``None``.

        A handler works on the raw connection, so a server restart surfaces as
        whatever it raises, often the driver's own error or one chained to it.
        Such a failure says nothing about the event: the batch is retried
        without counting a try. Only evidence that the server or the
        connection is gone makes an outage; any other error of the
        handler's, caught by it or not, is the event's. The store knows its
        driver's error codes and connection, so the core never has to.
        """

    def conflict(self, exc: BaseException) -> ConflictError | None:
        """The conflict behind ``exc`` (what a handler raised), or ``None``.

        The server aborted the transaction to let another through (a
        serialization failure, a deadlock): not the event's fault, and
        trying again usually succeeds. The caller retries a bounded number
        of times before it counts as a try.
        """


class InboxStore(Protocol):
    """Where the inbox keeps ``processed_events``."""

    def run(self, program: Program[T]) -> T:
        """Run ``program`` (:mod:`kinbox.core.steps`) in a transaction; return its result.

        The transaction commits when the program returns, and rolls back
        when it raises (what it raised passes through).

        Raises:
            StoreError: from the database (``transient`` says whether to retry).
                An error of COMMIT itself (a deferred constraint, a constraint
                trigger) is judged as a handler's statement would be; so is
                a transaction a failed statement left aborted, whose COMMIT
                would only roll it back: it raises, never ends quietly.
        """

    def known(self, events: Sequence[Event]) -> set[str]:
        """The ids of ``events`` this consumer has recorded with the same payload.

        ``events`` are one partition's, each id once. A read-only look at
        ``processed_events``, cheaper than a claim and without a transaction
        around it (:mod:`kinbox.apply.skim`). An id found is a duplicate for
        good: a committed row only ever goes by retention, so the claim would
        drop its events as well. An id counts as found only when its row
        holds the event's payload digest (:mod:`kinbox.core.reuse`), or none
        (a row claimed before digests were kept). An id not found may be fresh, or
        claimed by a transaction still open, or recorded with another payload
        (a reused id); each is left to the claim, which decides, and reports
        a reuse. Never waits for another transaction.

        Raises:
            StoreError: ``transient`` unless the database refused the ids.
        """

    def close(self) -> None:
        """Release connections."""


def first_occurrences(events: Sequence[Event]) -> list[Event]:
    """Return ``events`` without later repeats of an id (first occurrence wins)."""
    seen: set[str] = set()
    out = []
    for event in events:
        if event.id not in seen:
            seen.add(event.id)
            out.append(event)
    return out


@runtime_checkable
class AsyncCapable(Protocol):
    """A store that can also run async handlers' transactions."""

    def for_async(self) -> InboxStore:
        """The same inbox (same tables, same consumer), whose :meth:`~InboxStore.run` awaits.

        Its programs' awaiting calls (:class:`~kinbox.core.steps.Call`) are
        awaited where its connection lives.

        Asked once per async route when the worker's batch code is set up;
        it does no I/O then. Closing this store closes that one too.
        """


def async_store(store: InboxStore) -> InboxStore:
    """``store``'s inbox for async handlers.

    Raises:
        ConfigurationError: ``store`` cannot run them (it has no ``for_async``).
    """
    if isinstance(store, AsyncCapable):
        return store.for_async()
    raise ConfigurationError(
        f"an async handler needs an inbox store that runs async handlers; {store!r} does not "
        "(it has no for_async())"
    )


Invoke = Callable[[object, object, Any, Any], object]
"""``invoke(payload, event, tx, session)``: a handler called with its parameters filled."""


@runtime_checkable
class SessionCapable(Protocol):
    """A store that hands handlers an ORM session inside its transactions."""

    def sessions(self, session_class: type) -> Callable[[Invoke], Invoke]:
        """Wrap ``invoke``: its ``session`` is a fresh ``session_class`` in the call's transaction.

        The session runs on the connection the call gets as ``tx`` and joins
        the inbox transaction: what it writes commits with the event's claim,
        or not at all. Asked once per route whose handler takes a session,
        when the worker's batch code is set up (SQLAlchemy is loaded then).
        """


def session_opener(store: InboxStore, session_class: type) -> Callable[[Invoke], Invoke]:
    """What wraps a handler's call with a ``session_class`` session of ``store``'s transactions.

    Raises:
        ConfigurationError: ``store`` cannot (it has no ``sessions()``).
    """
    if isinstance(store, SessionCapable):
        return store.sessions(session_class)
    raise ConfigurationError(
        f"a handler that takes a {session_class.__name__} needs an inbox store that opens "
        f"sessions; {store!r} does not (it has no sessions())"
    )


def drive(program: Program[T], tx: InboxTransaction, wait: Callable[[Any], Any] | None = None) -> T:
    """Run ``program`` in ``tx``, each step on the calling thread; return its result.

    ``wait`` runs an awaiting :class:`Call`'s awaitable to its end (a store
    that has none refuses such a call with ``TypeError``). What the program
    raises passes through; a pipelined block it left open is closed first.
    """
    stepper = Stepper(program(tx))
    pipes: list[tuple[AbstractContextManager[Callable[[], bool]], Callable[[], bool]]] = []
    try:
        while (step := stepper.next()) is not None:
            try:
                stepper.answer(_run(step, tx, pipes, wait))
            except BaseException as exc:
                stepper.fail(exc)
    except BaseException as exc:
        while pipes:
            pipes.pop()[0].__exit__(type(exc), exc, exc.__traceback__)
        raise
    return stepper.result


def _run(
    step: Step,
    tx: InboxTransaction,
    pipes: list[tuple[AbstractContextManager[Callable[[], bool]], Callable[[], bool]]],
    wait: Callable[[Any], Any] | None,
) -> Any:
    """Do one step on ``tx``."""
    if isinstance(step, Call):
        with tx.savepoint() if step.guard == "savepoint" else tx.unguarded():
            result = step.run(tx.connection)
            if not step.awaits:
                return result
            if wait is None:
                raise TypeError("an async handler's call needs a store that awaits it")
            return wait(result)
    if isinstance(step, SyncPipeline):
        return pipes[-1][1]()
    if isinstance(step, Claim):
        return tx.claim(step.events, step.reclaim)
    if isinstance(step, CheckReused):
        return tx.reused(step.events)
    if isinstance(step, DeadLetterRow):
        return tx.dead_letter(step.event, step.reason)
    if isinstance(step, ParkingState):
        return tx.parking_state(step.topic, step.keys)
    if isinstance(step, Park):
        return tx.park(step)
    if isinstance(step, CheckDeferred):
        return tx.check_deferred()
    if isinstance(step, OpenPipeline):
        block = tx.pipelined()
        pipes.append((block, block.__enter__()))
        return None
    block = pipes.pop()[0]
    if step.error is None:
        block.__exit__(None, None, None)
    elif not block.__exit__(type(step.error), step.error, step.error.__traceback__):
        raise step.error
    return None
