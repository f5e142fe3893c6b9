"""The control flow that carries a handler's failure out of an inbox transaction.

:class:`HandlerFailed` (not the event's last try), :class:`Abandoned` (a
permanent failure on the optimistic pass, with its
:class:`~kinbox.core.outcome.Verdict`), :class:`Unpipelined` (a pipelined
pass failed somewhere) and :class:`Conflicted` (the server chose another
transaction): raised by the handler kinds and the dispatcher, caught by the
batch processor, never seen outside the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kinbox.core.describe import describe

if TYPE_CHECKING:
    from kinbox.core.event import Event
    from kinbox.core.outcome import Verdict


class HandlerFailed(Exception):
    """A handler failed, not for the last time: carries it out of the transaction."""

    def __init__(self, event: Event, cause: BaseException) -> None:
        super().__init__(describe(cause))
        self.event = event
        self.cause = cause


class Unpipelined(Exception):
    """A pipelined pass failed somewhere: roll back, redo without the pipeline.

    Under the pipeline a statement's error may surface in a later handler or
    only at the end, so it says nothing about which event failed; the redo
    runs each handler's statements one by one, and blames the right one.
    """

    def __init__(self, cause: BaseException) -> None:
        super().__init__(describe(cause))
        self.cause = cause


class Conflicted(Exception):
    """The server aborted the transaction over a conflict with another: roll back, redo at once.

    A serialization failure or a deadlock (:class:`~kinbox.core.errors.ConflictError`),
    met by ``event``'s handler, or (``event`` ``None``) by kinbox's own
    statement or COMMIT. Not a try of any event; :mod:`kinbox.apply.narrow`
    bounds how many come in a row.
    """

    def __init__(self, cause: BaseException, event: Event | None = None) -> None:
        super().__init__(describe(cause))
        self.cause = cause
        self.event = event


class Abandoned(Exception):
    """An optimistic pass met a permanent failure: roll back, redo carefully."""

    def __init__(self, event: Event, verdict: Verdict) -> None:
        super().__init__(verdict.reason)
        self.event = event
        self.verdict = verdict
