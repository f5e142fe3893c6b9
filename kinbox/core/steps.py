"""The inbox transaction as a program: the steps the engine asks of a store, without I/O.

The engine writes a transaction's body once (:mod:`kinbox.apply.batch`): a
generator that yields steps — claim these ids, call this handler under a
savepoint, record this dead letter — and receives each one's result, or has
its exception thrown in where the step was yielded. A store runs it
(:meth:`~kinbox.core.inbox.InboxStore.run`) on its own kind of connection:
the sync store step by step on the calling thread
(:func:`~kinbox.core.inbox.drive`), the async store awaiting each step on
its event loop, handlers included. So the same
body gives the same statements, savepoints and verdicts on either, and no
step crosses a thread.

A program gets a :class:`Seen` of its transaction: the
connection handlers receive, and the store's judgement of an exception
(outage, conflict), which need no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

if TYPE_CHECKING:
    from kinbox.core.errors import ConflictError, StoreError
    from kinbox.core.event import Event
    from kinbox.core.parking import Parked

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Claim:
    """Claim ``events``' ids; the result is the fresh events (:meth:`InboxTransaction.claim`)."""

    events: Sequence[Event]
    reclaim: Collection[str] = ()


@dataclass(frozen=True, slots=True)
class CheckReused:
    """Record which of ``events`` reuse an id with another payload; the result is the sightings.

    ``events`` are duplicates the claim just dropped (:meth:`InboxTransaction.reused`).
    """

    events: Sequence[Event]


@dataclass(frozen=True, slots=True)
class DeadLetterRow:
    """Set ``event``'s claimed row to ``dead_lettered`` (:meth:`InboxTransaction.dead_letter`)."""

    event: Event
    reason: str


@dataclass(frozen=True, slots=True)
class ParkingState:
    """Which of ``keys`` of ``topic`` are blocked: each one's state, by key.

    See :meth:`InboxTransaction.parking_state` and :class:`~kinbox.core.parking.KeyState`.
    """

    topic: str
    keys: Collection[bytes]


@dataclass(frozen=True, slots=True)
class Park:
    """Park events, block keys, and let released events and free keys go, in ``topic``.

    See :meth:`InboxTransaction.park`.
    """

    topic: str
    parked: Sequence[Parked] = ()
    blocked: Sequence[tuple[bytes, str]] = ()
    """(key, event id of the dead letter it now waits behind)."""
    unparked: Sequence[str] = ()
    """Released events that ran: their parked rows go."""
    freed: Collection[bytes] = ()
    """Keys to free (released, or their dead letter applied), if none of their
    events is parked any more."""


@dataclass(frozen=True, slots=True)
class CheckDeferred:
    """Run the checks COMMIT would run, now (:meth:`InboxTransaction.check_deferred`)."""


Guard = Literal["savepoint", "unguarded"]
"""How a :class:`Call` is fenced: its own savepoint, or none (a failure spoils the transaction)."""


@dataclass(frozen=True, slots=True)
class Call:
    """Call ``run(connection)`` inside ``guard``; the result is what it returned.

    With ``awaits``, ``run`` returns an awaitable (an async handler's call),
    awaited where the connection lives; its result is the step's.
    """

    run: Callable[[Any], object]
    guard: Guard
    awaits: bool = False


@dataclass(frozen=True, slots=True)
class OpenPipeline:
    """Begin a pipelined block (:meth:`InboxTransaction.pipelined`); its :class:`Call` s follow."""


@dataclass(frozen=True, slots=True)
class SyncPipeline:
    """Wait for the open pipeline's statements; the result says whether all succeeded."""


@dataclass(frozen=True, slots=True)
class ClosePipeline:
    """End the pipelined block, with the exception that ends it, if any.

    The store throws back that exception, or what it makes of it (a
    :class:`~kinbox.core.errors.StoreError`), or an error of its own.
    """

    error: BaseException | None = field(default=None)


Step = (
    Claim
    | CheckReused
    | DeadLetterRow
    | ParkingState
    | Park
    | CheckDeferred
    | Call
    | OpenPipeline
    | SyncPipeline
    | ClosePipeline
)
"""Anything a program may ask of the store."""

Steps = Generator[Step, Any, T]
"""A running program: it yields steps, receives their results, returns its own."""


def pipelined(body: Steps[T]) -> Steps[T]:
    """``body`` inside a pipelined block: opened before it, closed after it, also on failure."""
    yield OpenPipeline()
    try:
        result = yield from body
    except BaseException as exc:
        yield ClosePipeline(exc)
        raise  # the store threw back what ends the block; reached only if it did not
    yield ClosePipeline()
    return result


class Seen(Protocol):
    """What a program sees of its transaction without a step: nothing here does I/O."""

    @property
    def connection(self) -> Any:
        """The object handlers receive as ``tx``."""

    def outage(self, exc: BaseException) -> StoreError | None:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.outage`."""

    def conflict(self, exc: BaseException) -> ConflictError | None:
        """See :meth:`~kinbox.core.inbox.InboxTransaction.conflict`."""


Program = Callable[[Seen], Steps[T]]
"""The body of one inbox transaction: given what it sees of it, its steps."""


class Stepper(Generic[T]):
    """Runs a program for a driver: the next step, then its result or its exception."""

    __slots__ = ("_error", "_steps", "_value", "result")

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self._value: Any = None
        self._error: BaseException | None = None
        self.result: T
        """What the program returned, once :meth:`next` returned ``None``."""

    def next(self) -> Step | None:
        """The next step, the last one's result or exception sent in; ``None`` when done.

        Raises:
            BaseException: what the program raised.
        """
        value, error = self._value, self._error
        self._value = self._error = None
        try:
            return self._steps.send(value) if error is None else self._steps.throw(error)
        except StopIteration as done:
            self.result = done.value
            return None

    def answer(self, value: Any) -> None:
        """The step's result."""
        self._value = value

    def fail(self, exc: BaseException) -> None:
        """The step raised ``exc``: it is thrown into the program where the step was yielded."""
        self._error = exc


def rewrite(steps: Steps[T], through: Callable[[Step], Steps[Any]]) -> Steps[T]:
    """``steps``, each one run as ``through(step)`` says: a wrapper's view of a program.

    ``through`` yields what the store is to do for the step (the step itself,
    usually) and returns its result, which goes back to ``steps``; what it
    raises is thrown into ``steps`` there.
    """
    stepper = Stepper(steps)
    while (step := stepper.next()) is not None:
        try:
            stepper.answer((yield from through(step)))
        except BaseException as exc:
            stepper.fail(exc)
    return stepper.result
