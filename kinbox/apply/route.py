"""What one registration is: :class:`Route`, and the handler signatures it holds.

A leaf: it imports nothing of the stages, so the registry (:mod:`kinbox.app`),
the batch processor and the middleware all depend on it and on nothing of
each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kinbox.event import Event

EventHandler = Callable[[Event, Any], object]
"""``handler(event, tx)``: ``tx`` is the psycopg ``Connection``, inside the inbox transaction."""
BatchHandler = Callable[[list[Event], Any], object]
"""``handler(events, tx)``: the fresh events of one partition batch, in offset order."""


@dataclass(frozen=True)
class Route:
    """One registration: which function handles a topic, and in which form."""

    topic: str
    fn: Callable[..., object]
    batch: bool
    max_attempts: int | None = None
    """Tries before a failing event is dead-lettered; ``None``: the ``max_attempts`` setting."""
    dead_letter_topic: str | None = None
    """Where this topic's dead letters go; ``None``: ``<topic>.dlq``."""

    @property
    def dlq_topic(self) -> str:
        """The dead-letter topic of this route."""
        return self.dead_letter_topic or f"{self.topic}.dlq"

    @property
    def name(self) -> str:
        """The handler's qualified name, for logs."""
        module = getattr(self.fn, "__module__", "?")
        return f"{module}.{getattr(self.fn, '__qualname__', repr(self.fn))}"
