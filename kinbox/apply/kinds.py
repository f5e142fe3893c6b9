"""The handler kinds: how a registered function is called, chosen when it is registered.

:class:`EachEvent` calls ``fn(event, tx)`` once per fresh event;
:class:`WholeBatch` calls ``fn(events, tx)`` once per partition batch. The
registry picks one (:func:`kind_for`), the way FastStream's subscriber
factory picks a use case, and the dispatcher runs whichever it is given:
nothing on the hot path asks which kind it holds. A new kind is a new class
here, not a new branch in the dispatcher.

``async def`` handlers are :class:`AwaitedEachEvent` and
:class:`AwaitedWholeBatch`: the same passes, savepoints and verdicts as their
sync parents, with one difference, the call: an awaiting
:class:`~kinbox.core.steps.Call`, which the async store awaits on the event
loop that owns the transaction's ``AsyncConnection``, inside the
middleware's ``around_event_async``. Their :meth:`pick_store` asks the
worker's store for the same inbox on an async connection, once, when the
worker starts.

Both kinds judge failures the same way, through :class:`~kinbox.apply.route.Calls`:
an outage propagates, a conflict redoes the batch at once (a bounded number
of times: :class:`~kinbox.apply.control.Conflicted`), a failure that will be
tried again stops the pass
(:class:`~kinbox.apply.control.HandlerFailed`), a permanent one is either
dead-lettered in place (careful pass) or abandons the optimistic pass
(:class:`~kinbox.apply.control.Abandoned`) so the batch is redone carefully.

What a call raises that is no ``Exception`` is translated at the call itself
(:func:`_called`, and :func:`_awaited` for an async handler, on the loop):
``SystemExit`` and ``KeyboardInterrupt`` ask the process to stop, and become
:class:`~kinbox.core.errors.ExitRequested`, which no pass judges: the transaction
rolls back and the worker stops with its own status. Any other
``BaseException`` (``GeneratorExit``, a library's own subclass) is the event's
failure like any exception (:class:`~kinbox.core.errors.HandlerAborted`), so one
event can never end the worker on every redelivery. Inside an event loop's
task the first two must be caught before the task sees them: asyncio lets
them end the loop's thread, and every call waiting on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

from kinbox.apply.control import Abandoned, HandlerFailed, Unpipelined
from kinbox.apply.route import Calls, HandlerKind
from kinbox.core.describe import describe
from kinbox.core.errors import ExitRequested, HandlerAborted, HandlerCancelled, WorkerExit
from kinbox.core.event import Event
from kinbox.core.inbox import InboxStore, async_store
from kinbox.core.outcome import Verdict
from kinbox.core.steps import Call, Guard, Steps, SyncPipeline, pipelined
from kinbox.core.transport import ValueReader
from kinbox.params.wrap import Prepared

T = TypeVar("T")


class _Kind:
    """What every kind holds: the prepared handler, and its call."""

    def __init__(self, prepared: Prepared) -> None:
        self._prepared = prepared
        self._fn: Callable[[Any, Any], object] = prepared.call

    def bound(self, store: InboxStore, value_reader: ValueReader | None) -> HandlerKind:
        """See :meth:`HandlerKind.bound`: a kind of the same class, or itself."""
        if not self._prepared.unbound:
            return cast(HandlerKind, self)
        return cast(HandlerKind, type(self)(self._prepared.bound(store, value_reader)))


class EachEvent(_Kind):
    """``fn(event, tx)`` per fresh event: optimistically, then carefully if need be.

    The optimistic pass runs the events one after another with no savepoint,
    so a fresh event costs only its handler's own statements; the careful
    pass gives each its own savepoint, so a permanent failure is
    dead-lettered without undoing the others.

    The optimistic pass runs pipelined when allowed and there is more than
    one event: the handlers' statements go out without a round trip each (one
    event's would gain nothing, and a pipeline costs CPU). A database error
    there is not blamed on the event that saw it (the statement that failed
    may be an earlier event's), and a handler that caught one returns as if
    nothing happened: the pass raises :class:`Unpipelined`, and the batch is
    redone with the plain optimistic pass, which blames the right event. So
    is a pass in which the pipeline refused a call that works without it (a
    COPY), caught or not. A handler's own exception, raised while every
    statement so far has succeeded, is judged at once, as on the plain pass.
    """

    name = "event"

    def __init__(self, prepared: Prepared) -> None:
        super().__init__(prepared)
        # Never pipelined: an ORM session's statements read their results at once.
        self._pipelines = prepared.session is None

    def run(
        self, calls: Calls, events: list[Event], *, careful: bool, pipelined: bool = False
    ) -> Steps[None]:
        """See :meth:`HandlerKind.run`."""
        if pipelined and self._pipelines and not careful and len(events) > 1:
            yield from self._pipelined(calls, events)
            return
        for event in events:
            if careful:
                yield from self._careful(calls, event)
            else:
                yield from self._optimistic(calls, event)

    def _call(self, calls: Calls, event: Event, guard: Guard) -> Call:
        fn = self._fn
        return Call(
            lambda connection: calls.around_event(event, lambda e: _called(fn, e, connection)),
            guard,
        )

    def _pipelined(self, calls: Calls, events: list[Event]) -> Steps[None]:
        own: tuple[Event, Exception] | None = None

        def body() -> Steps[tuple[Event, Exception] | None]:
            for event in events:
                try:
                    yield self._call(calls, event, "unguarded")
                except Exception as exc:
                    if not (yield SyncPipeline()):
                        raise  # some statement failed, maybe an earlier event's
                    # Every statement so far succeeded: the handler's own
                    # exception, judged as on the plain pass.
                    return (event, exc)
            return None

        try:
            own = yield from pipelined(body())
        except Exception as exc:
            outage = calls.tx.outage(exc)
            if outage is not None:
                raise outage from exc  # the batch waits: nothing to redo now
            raise Unpipelined(exc) from exc
        if own is not None:
            self._judge(calls, *own)

    def _optimistic(self, calls: Calls, event: Event) -> Steps[None]:
        try:
            yield self._call(calls, event, "unguarded")
        except Exception as exc:
            self._judge(calls, event, exc)

    def _judge(self, calls: Calls, event: Event, exc: Exception) -> None:
        """Stop the optimistic pass at ``event``, which raised ``exc``."""
        reason = calls.permanent(exc, event)
        if reason is None:
            raise HandlerFailed(event, exc) from exc
        raise Abandoned(event, Verdict(reason, exc)) from exc

    def _careful(self, calls: Calls, event: Event) -> Steps[None]:
        if calls.held(event):
            return
        try:
            yield self._call(calls, event, "savepoint")
        except Exception as exc:
            reason = calls.permanent(exc, event)
            if reason is None:
                raise HandlerFailed(event, exc) from exc
            calls.dead_letter(event, reason, exc)

    def pick_store(self, store: InboxStore) -> InboxStore:
        """See :meth:`HandlerKind.pick_store`: ``store`` itself."""
        return store


class WholeBatch(_Kind):
    """``fn(events, tx)`` once per partition batch, under one savepoint.

    On the events' last try the function cannot say which event is the
    poison, so it is handed them one at a time and those that still fail are
    dead-lettered. The optimistic and careful passes are the same here: the
    savepoint already isolates the call.
    """

    name = "batch"

    def run(
        self, calls: Calls, events: list[Event], *, careful: bool, pipelined: bool = False
    ) -> Steps[None]:
        """See :meth:`HandlerKind.run` (one call needs no pipeline: ``pipelined`` is ignored)."""
        if not events:
            return
        # Only the first event can be on a later try: a failure stops the
        # partition there, so the next batch starts with it.
        attempt = events[0].attempt
        try:
            yield self._call(calls, events)
            return
        except Exception as exc:
            if calls.permanent(exc, events[0]) is None:
                raise HandlerFailed(events[0], exc) from exc
        for event in events:
            if calls.held(event):
                continue
            try:
                yield self._call(calls, [event])
            except Exception as exc:
                reason = calls.permanent(exc, event, max(attempt, calls.limit))
                assert reason is not None
                calls.dead_letter(event, reason, exc)

    def _call(self, calls: Calls, events: list[Event]) -> Call:
        fn = self._fn
        return Call(
            lambda connection: calls.around_events(
                events, lambda evs: _called(fn, list(evs), connection)
            ),
            "savepoint",
        )

    def pick_store(self, store: InboxStore) -> InboxStore:
        """See :meth:`HandlerKind.pick_store`: ``store`` itself."""
        return store


class AwaitedEachEvent(EachEvent):
    """``await fn(event, conn)`` per fresh event, ``conn`` the ``AsyncConnection``.

    Everything but the call is :class:`EachEvent`'s: the call is awaited
    where the connection lives, inside every middleware's ``around_event_async``.
    """

    def pick_store(self, store: InboxStore) -> InboxStore:
        """See :meth:`HandlerKind.pick_store`: the inbox on an async connection."""
        return async_store(store)

    def _call(self, calls: Calls, event: Event, guard: Guard) -> Call:
        fn = self._fn
        return Call(
            lambda connection: calls.around_event_async(
                event, lambda e: _awaited(fn, e, connection)
            ),
            guard,
            awaits=True,
        )


class AwaitedWholeBatch(WholeBatch):
    """``await fn(events, conn)`` once per partition batch, ``conn`` the ``AsyncConnection``.

    Everything but the call is :class:`WholeBatch`'s (see :class:`AwaitedEachEvent`).
    """

    def pick_store(self, store: InboxStore) -> InboxStore:
        """See :meth:`HandlerKind.pick_store`: the inbox on an async connection."""
        return async_store(store)

    def _call(self, calls: Calls, events: list[Event]) -> Call:
        fn = self._fn
        return Call(
            lambda connection: calls.around_events_async(
                events, lambda evs: _awaited(fn, list(evs), connection)
            ),
            "savepoint",
            awaits=True,
        )


def _called(fn: Callable[..., T], subject: Event | list[Event], *args: Any) -> T:
    """``fn(subject, *args)``, a handler's call; a ``BaseException`` it raises is translated here.

    Raises:
        ExitRequested: the call raised ``SystemExit`` or ``KeyboardInterrupt``.
        HandlerAborted: the call raised another ``BaseException`` (not a
            :class:`~kinbox.core.errors.WorkerExit`, which passes unchanged).
    """
    try:
        return fn(subject, *args)
    except Exception:
        raise
    except BaseException as exc:
        raise _translated(exc, subject) from exc


async def _awaited(fn: Callable[..., object], subject: Event | list[Event], *args: Any) -> object:
    """``await fn(subject, *args)``, an async handler's call; a ``BaseException`` translated.

    On the event loop, where asyncio would let ``SystemExit`` or
    ``KeyboardInterrupt`` end the loop's thread. A cancellation inside the
    call is the handler's failure.

    Raises:
        ExitRequested, HandlerAborted: as :func:`_called`.
        HandlerCancelled: the call was cancelled.
    """
    try:
        return await cast(Awaitable[object], fn(subject, *args))
    except Exception:
        raise
    except asyncio.CancelledError as exc:
        raise HandlerCancelled(f"the async handler's coroutine was cancelled: {exc!r}") from exc
    except BaseException as exc:
        raise _translated(exc, subject) from exc


def _translated(exc: BaseException, subject: Event | list[Event]) -> BaseException:
    """What a handler's ``BaseException`` ``exc`` becomes (see the module docstring)."""
    if isinstance(exc, WorkerExit):
        return exc
    where = _where(subject)
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return ExitRequested(
            f"the handler of {where} raised {describe(exc)}: stopping the worker. Its "
            "transaction is rolled back and its offset not committed, so a restart meets "
            "the event again"
        )
    return HandlerAborted(
        f"the handler of {where} raised {describe(exc)}, a BaseException: a failed try of "
        "the event, like any exception"
    )


def _where(subject: Event | Sequence[Event]) -> str:
    events = [subject] if isinstance(subject, Event) else list(subject)
    if not events:
        return "no event"
    first, last = events[0], events[-1]
    place = f"{first.topic}[{first.partition}]@{first.offset}"
    if len(events) == 1:
        return f"{place} (event {first.id!r})"
    return f"{place}..{last.offset} ({len(events)} events)"


def kind_for(prepared: Prepared, *, batch: bool) -> HandlerKind:
    """The kind that calls ``prepared``: per batch if ``batch``, else per event; awaited if async.

    A per-event handler that takes an ORM session never runs its optimistic
    pass in pipeline mode: its statements read their results at once.
    """
    if prepared.awaits:
        return AwaitedWholeBatch(prepared) if batch else AwaitedEachEvent(prepared)
    return WholeBatch(prepared) if batch else EachEvent(prepared)
