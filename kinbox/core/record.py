"""A consumed Kafka record as the engine sees it: plain data, no client objects.

The Kafka driver builds one per record it hands over
(:class:`~kinbox.core.transport.Transport`); the engine turns it into an
:class:`~kinbox.core.event.Event` (:mod:`kinbox.apply.envelope`), dead letters
carry it (:class:`~kinbox.core.letter.Letter`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

Position = tuple[str, int, int]
"""Where a record is: ``(topic, partition, offset)``, its identity in the group's log."""


class Record(NamedTuple):
    """A Kafka record as the transport hands it over: plain data, no client objects.

    An immutable named tuple: one is built per consumed record, and a tuple
    costs a fraction of a frozen dataclass to build.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()
    timestamp: int | None = None
    headers_error: str | None = None
    """Why the headers could not be read (then ``headers`` is empty), if they could not."""

    @property
    def position(self) -> Position:
        """``(topic, partition, offset)``."""
        return (self.topic, self.partition, self.offset)
