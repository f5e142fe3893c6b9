"""What one registration is: :class:`Route`, and how its function is called (:class:`HandlerKind`).

A leaf: it imports nothing of the stages, so the registry (:mod:`kinbox.app`),
the batch processor and the middleware all depend on it and on nothing of
each other. The kinds themselves are in :mod:`kinbox.apply.kinds`; one is
chosen when the handler is registered, so no call branches on a flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from kinbox.core.event import Event

if TYPE_CHECKING:
    from kinbox.core.inbox import InboxStore
    from kinbox.core.steps import Seen, Steps
    from kinbox.core.transport import ValueReader

Ordering = Literal["partition", "key"]
"""What a route keeps in order: a partition's records, or each key's."""

EventHandler = Callable[[Event, Any], object]
"""``handler(event, tx)``: ``tx`` is the psycopg ``Connection`` (an ``AsyncConnection`` for
an ``async def`` handler), inside the inbox transaction."""
BatchHandler = Callable[[list[Event], Any], object]
"""``handler(events, tx)``: the fresh events of one partition batch, in offset order."""


class Calls(Protocol):
    """What a :class:`HandlerKind` may do in one inbox transaction; the dispatcher provides it."""

    @property
    def tx(self) -> Seen:
        """What the kind sees of the open transaction: the connection handlers get."""

    @property
    def limit(self) -> int:
        """Tries before an event of this route is dead-lettered."""

    def permanent(self, exc: Exception, event: Event, attempt: int | None = None) -> str | None:
        """The dead-letter reason if ``exc`` gives ``event`` up, else ``None``.

        ``attempt``: the try to judge it as, if not the event's own.

        Raises:
            StoreError: ``exc`` comes from a database outage.
            Conflicted: ``exc`` comes from a conflict the batch retries at once.
        """

    def dead_letter(self, event: Event, reason: str, error: BaseException) -> None:
        """Give ``event`` up for ``reason``: its dead letter is recorded with the batch."""

    def held(self, event: Event) -> bool:
        """Whether ``event`` waits behind an earlier dead letter of its key: then skip it.

        Only a route that parks keys holds any (:mod:`kinbox.apply.parking`).
        """

    def around_event(self, event: Event, call: Callable[[Event], object]) -> object:
        """Run ``call(event)`` inside every middleware's ``around_event``."""

    def around_events(
        self, events: Sequence[Event], call: Callable[[Sequence[Event]], object]
    ) -> object:
        """Run ``call(events)`` inside every middleware's ``around_events``."""

    def around_event_async(
        self, event: Event, call: Callable[[Event], Awaitable[object]]
    ) -> Awaitable[object]:
        """Await ``call(event)`` inside every middleware's ``around_event_async``."""

    def around_events_async(
        self, events: Sequence[Event], call: Callable[[Sequence[Event]], Awaitable[object]]
    ) -> Awaitable[object]:
        """Await ``call(events)`` inside every middleware's ``around_events_async``."""


class HandlerKind(Protocol):
    """How a route's function is called over the fresh events of one transaction.

    ``careful`` is false on the optimistic pass (no savepoints, a permanent
    failure abandons the pass) and true when the batch is redone after one
    (a savepoint per call, permanent failures dead-lettered in place).
    ``pipelined`` (only ever with ``careful`` false) allows the optimistic pass
    to send its statements without waiting for each result
    (:meth:`~kinbox.core.inbox.InboxTransaction.pipelined`); a kind that uses
    it raises :class:`~kinbox.apply.control.Unpipelined` on any failure.
    """

    @property
    def name(self) -> str:
        """``event`` or ``batch``: for logs and ``repr``."""

    def run(
        self, calls: Calls, events: list[Event], *, careful: bool, pipelined: bool = False
    ) -> Steps[None]:
        """The steps that call the function over ``events`` (in offset order).

        Each call is a :class:`~kinbox.core.steps.Call` step, under a
        savepoint or none, or inside a pipelined block.

        Raises:
            HandlerFailed: a call failed and the event will be tried again.
            Abandoned: the optimistic pass met a permanent failure.
            Unpipelined: a pipelined pass failed (which event is unknown).
            StoreError: the database went away (also when a handler saw it).
        """

    def bound(self, store: InboxStore, value_reader: ValueReader | None) -> HandlerKind:
        """The kind with what its handler needs of the drivers (asked once, at start).

        ``store`` is the one :meth:`pick_store` chose: it opens a handler's
        ORM session; ``value_reader`` reads what a confluent-kafka
        deserializer makes of a value. Itself when the handler needs neither.

        Raises:
            ConfigurationError: the handler needs what is not there.
        """

    def pick_store(self, store: InboxStore) -> InboxStore:
        """The store this kind's transactions run in, given the worker's (asked once, at start).

        ``store`` itself for a sync function; the same inbox on an async
        connection (:meth:`~kinbox.core.inbox.AsyncCapable.for_async`) for an
        ``async def`` one.

        Raises:
            ConfigurationError: ``store`` cannot give what the kind needs.
        """


@dataclass(frozen=True)
class Route:
    """One registration: which function handles a topic, and how it is called."""

    topic: str
    fn: Callable[..., object]
    kind: HandlerKind
    max_attempts: int | None = None
    """Tries before a failing event is dead-lettered; ``None``: the ``max_attempts`` setting."""
    dead_letter_topic: str | None = None
    """Where this topic's dead letters go; ``None``: ``<topic>.dlq``."""
    ordering: Ordering = "partition"
    """``partition``: a partition's records one after the other; ``key``: one
    key's records in order, different keys' side by side (:mod:`kinbox.apply.keyed`)."""
    concurrency: int = 1
    """Units of this route applied at once, in key order (one connection each)."""
    park_keys: bool = False
    """Whether a dead letter parks its key's later events (:mod:`kinbox.core.parking`)."""

    def bound(self, store: InboxStore, value_reader: ValueReader | None) -> Route:
        """The route with what its handler needs of the drivers (:meth:`HandlerKind.bound`)."""
        kind = self.kind.bound(store, value_reader)
        return self if kind is self.kind else dataclasses.replace(self, kind=kind)

    @property
    def batch(self) -> bool:
        """Whether the function takes the batch's events as one list."""
        return self.kind.name == "batch"

    @property
    def dlq_topic(self) -> str:
        """The dead-letter topic of this route."""
        return self.dead_letter_topic or f"{self.topic}.dlq"

    @property
    def name(self) -> str:
        """The handler's qualified name, for logs."""
        module = getattr(self.fn, "__module__", "?")
        return f"{module}.{getattr(self.fn, '__qualname__', repr(self.fn))}"
