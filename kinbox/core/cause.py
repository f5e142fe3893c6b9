"""Which inbox event the running handler works for: what ``enqueue`` records as a row's cause.

kinbox sets the cause around each handler call (per event: that event; a
batch handler of one event: that event; a longer batch: the consumer group
only, until the handler narrows it with :func:`caused_by`). It is a
:class:`contextvars.ContextVar`, so setting it costs no database round trip
and it follows the handler's thread. ``producer_outbox.enqueue`` reads it and
stores ``caused_by_consumer`` / ``caused_by_event_id`` on the outbox row,
which ``kinbox explain`` shows as what the event's transaction enqueued.

A leaf: it imports nothing of kinbox's stages, so the dispatcher and the
outbox writer both depend on it and on nothing of each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kinbox.core.event import Event


@dataclass(frozen=True, slots=True)
class Cause:
    """The consumer group and, when one event is meant, the event a handler works for."""

    consumer: str
    event_id: str | None


_CURRENT: ContextVar[Cause | None] = ContextVar("kinbox_cause", default=None)


def current() -> Cause | None:
    """The cause of the handler running in this context, or ``None`` outside handlers."""
    return _CURRENT.get()


@contextmanager
def handling(consumer: str, event_id: str | None) -> Iterator[None]:
    """Set the cause for the block (kinbox calls it around each handler call)."""
    token = enter(consumer, event_id)
    try:
        yield
    finally:
        leave(token)


def enter(consumer: str, event_id: str | None) -> Token[Cause | None]:
    """Set the cause; :func:`leave` with the token restores the one before.

    :func:`handling` without its generator, for the per-event dispatcher,
    which sets a cause around every handler call.
    """
    return _CURRENT.set(Cause(consumer, event_id))


def leave(token: Token[Cause | None]) -> None:
    """Restore the cause :func:`enter` replaced."""
    _CURRENT.reset(token)


@contextmanager
def caused_by(event: Event) -> Iterator[None]:
    """In a batch handler, say which of its events the rows enqueued in the block belong to.

    ::

        @app.handler("orders", batch=True)
        def on_orders(events, tx):
            for event in events:
                with caused_by(event):
                    enqueue(tx, "invoices", invoice_for(event))

    Outside a handler it does nothing: there is no consumer group to name.
    """
    outer = _CURRENT.get()
    if outer is None:
        yield
        return
    with handling(outer.consumer, event.id):
        yield
