"""The handler kinds: how a registered function is called, chosen when it is registered.

:class:`EachEvent` calls ``fn(event, tx)`` once per fresh event;
:class:`WholeBatch` calls ``fn(events, tx)`` once per partition batch. The
registry picks one (:func:`kind_for`), the way FastStream's subscriber
factory picks a use case, and the dispatcher runs whichever it is given:
nothing on the hot path asks which kind it holds. A new kind (async, typed
payloads) is a new class here, not a new branch in the dispatcher.

Both kinds judge failures the same way, through :class:`~kinbox.apply.route.Calls`:
an outage propagates, a failure that will be tried again stops the pass
(:class:`~kinbox.apply.outcome.HandlerFailed`), a permanent one is either
dead-lettered in place (careful pass) or abandons the optimistic pass
(:class:`~kinbox.apply.outcome.Abandoned`) so the batch is redone carefully.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kinbox.apply.outcome import Abandoned, HandlerFailed, Unpipelined, Verdict
from kinbox.apply.route import Calls, HandlerKind
from kinbox.event import Event


class EachEvent:
    """``fn(event, tx)`` per fresh event: optimistically, then carefully if need be.

    The optimistic pass runs the events one after another with no savepoint,
    so a fresh event costs only its handler's own statements; the careful
    pass gives each its own savepoint, so a permanent failure is
    dead-lettered without undoing the others.

    The optimistic pass runs pipelined when allowed: the handlers' statements
    go out without a round trip each. A database error there is not blamed on
    the event that saw it (the statement that failed may be an earlier
    event's): the pass raises :class:`Unpipelined`, and the batch is redone
    with the plain optimistic pass, which blames the right event. A handler's
    own exception, raised while every statement so far has succeeded, is
    judged at once, as on the plain pass.
    """

    name = "event"

    def __init__(self, fn: Callable[[Event, Any], object]) -> None:
        self._fn = fn

    def run(
        self, calls: Calls, events: list[Event], *, careful: bool, pipelined: bool = False
    ) -> None:
        """See :meth:`HandlerKind.run`."""
        if pipelined and not careful and events:
            self._pipelined(calls, events)
            return
        for event in events:
            if careful:
                self._careful(calls, event)
            else:
                self._optimistic(calls, event)

    def _call(self, calls: Calls, event: Event) -> None:
        connection = calls.tx.connection
        calls.around_event(event, lambda e: self._fn(e, connection))

    def _pipelined(self, calls: Calls, events: list[Event]) -> None:
        own: tuple[Event, Exception] | None = None
        try:
            with calls.tx.pipelined() as settle:
                for event in events:
                    try:
                        with calls.tx.unguarded():
                            self._call(calls, event)
                    except Exception as exc:
                        if not settle():
                            raise  # some statement failed, maybe an earlier event's
                        # Every statement so far succeeded: the handler's own
                        # exception, judged as on the plain pass.
                        own = (event, exc)
                        break
        except Exception as exc:
            outage = calls.tx.outage(exc)
            if outage is not None:
                raise outage from exc  # the batch waits: nothing to redo now
            raise Unpipelined(exc) from exc
        if own is not None:
            self._judge(calls, *own)

    def _optimistic(self, calls: Calls, event: Event) -> None:
        try:
            with calls.tx.unguarded():
                self._call(calls, event)
        except Exception as exc:
            self._judge(calls, event, exc)

    def _judge(self, calls: Calls, event: Event, exc: Exception) -> None:
        """Stop the optimistic pass at ``event``, which raised ``exc``."""
        reason = calls.permanent(exc, event.attempt)
        if reason is None:
            raise HandlerFailed(event, exc) from exc
        raise Abandoned(event, Verdict(reason, exc)) from exc

    def _careful(self, calls: Calls, event: Event) -> None:
        try:
            with calls.tx.savepoint():
                self._call(calls, event)
        except Exception as exc:
            reason = calls.permanent(exc, event.attempt)
            if reason is None:
                raise HandlerFailed(event, exc) from exc
            calls.dead_letter(event, reason, exc)


class WholeBatch:
    """``fn(events, tx)`` once per partition batch, under one savepoint.

    On the events' last try the function cannot say which event is the
    poison, so it is handed them one at a time and those that still fail are
    dead-lettered. The optimistic and careful passes are the same here: the
    savepoint already isolates the call.
    """

    name = "batch"

    def __init__(self, fn: Callable[[list[Event], Any], object]) -> None:
        self._fn = fn

    def run(
        self, calls: Calls, events: list[Event], *, careful: bool, pipelined: bool = False
    ) -> None:
        """See :meth:`HandlerKind.run` (one call needs no pipeline: ``pipelined`` is ignored)."""
        if not events:
            return
        # Only the first event can be on a later try: a failure stops the
        # partition there, so the next batch starts with it.
        attempt = events[0].attempt
        try:
            with calls.tx.savepoint():
                self._call(calls, events)
            return
        except Exception as exc:
            if calls.permanent(exc, attempt) is None:
                raise HandlerFailed(events[0], exc) from exc
        for event in events:
            try:
                with calls.tx.savepoint():
                    self._call(calls, [event])
            except Exception as exc:
                reason = calls.permanent(exc, max(attempt, calls.limit))
                assert reason is not None
                calls.dead_letter(event, reason, exc)

    def _call(self, calls: Calls, events: list[Event]) -> None:
        connection = calls.tx.connection
        calls.around_events(events, lambda evs: self._fn(list(evs), connection))


def kind_for(fn: Callable[..., object], *, batch: bool) -> HandlerKind:
    """The kind that calls ``fn``: :class:`WholeBatch` if ``batch``, else :class:`EachEvent`."""
    return WholeBatch(fn) if batch else EachEvent(fn)
