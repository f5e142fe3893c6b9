"""The event a handler receives: one Kafka record with a validated id.

An immutable named tuple rather than a frozen dataclass: a worker builds one
for every record it consumes, and a frozen dataclass's ``__init__`` (one
``object.__setattr__`` per field) cost several times a tuple's — a large
share of a replay's time, where nothing else happens to a duplicate.
"""

from __future__ import annotations

import json as _json
from collections.abc import Sequence
from typing import Any, NamedTuple

from kinbox.core.record import Position

_BOM = b"\xef\xbb\xbf"
_BOMS_16 = (b"\xff\xfe", b"\xfe\xff")


class Event(NamedTuple):
    """One Kafka record, as a handler sees it (immutable).

    Attributes:
        id: the event id (from the first configured id header present); the
            inbox deduplicates on ``(consumer group, id)``.
        topic: the topic the record came from.
        partition: its partition.
        offset: its offset in that partition.
        key: the record key, or ``None``.
        value: the raw payload bytes (``b""`` for a tombstone).
        headers: every record header, in order; a name may repeat.
        timestamp: the record timestamp in milliseconds since the epoch, if any.
        attempt: 1 on the first try in this process, 2 after one failed try, ...
    """

    id: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: Sequence[tuple[str, bytes | None]] = ()
    timestamp: int | None = None
    attempt: int = 1

    def __repr__(self) -> str:
        # The headers are left out: they may be long, and hold anything.
        return (
            f"Event(id={self.id!r}, topic={self.topic!r}, partition={self.partition!r}, "
            f"offset={self.offset!r}, key={self.key!r}, value={self.value!r}, "
            f"timestamp={self.timestamp!r}, attempt={self.attempt!r})"
        )

    @property
    def position(self) -> Position:
        """``(topic, partition, offset)``: where its record is, whatever its id."""
        return (self.topic, self.partition, self.offset)

    def json(self) -> Any:
        """Decode the payload as JSON (UTF-8).

        Raises:
            ValueError: the payload is not valid JSON (``json.JSONDecodeError``
                or ``UnicodeDecodeError``, both ``ValueError``).
        """
        value = self.value
        if value[:3] == _BOM or value[:2] in _BOMS_16 or b"\x00" in value:
            # A byte order mark, or UTF-16/32 (NUL bytes): json's own detection.
            return _json.loads(value)
        # What json.loads(bytes) does for UTF-8, without detecting it first
        # (that was half the cost of a small payload's decode).
        return _json.loads(value.decode("utf-8", "surrogatepass"))

    def header(self, name: str) -> bytes | None:
        """Return the value of the first header called ``name``, or ``None``."""
        for key, value in self.headers:
            if key == name:
                return value
        return None
