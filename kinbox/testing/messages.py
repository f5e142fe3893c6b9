"""What a test delivers: :class:`Message`, and how it becomes a Kafka record.

A message is what a producer would have sent (topic, payload, key, headers,
an event id); the test client gives it a partition and the next offset there,
as the broker would, and hands the record to the worker's code.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kinbox.core.record import Record

Header = tuple[str, bytes | None]
Headers = Mapping[str, str | bytes | None] | Sequence[tuple[str, str | bytes | None]]
"""Record headers as a mapping or as ``(name, value)`` pairs (a name may repeat)."""


class Fresh(enum.Enum):
    """The default event id: a fresh, unique one."""

    ID = "a fresh event id"


FRESH = Fresh.ID
"""Give the message a fresh, unique event id (the default of ``id=``)."""


def fresh_id() -> str:
    """A new unique event id."""
    return f"evt-{uuid.uuid4().hex}"


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Message:
    """One message to deliver: what a producer sent, before the broker placed it.

    Args:
        topic: the topic it is delivered on.
        payload: the record value: ``bytes`` as they are, ``str`` as UTF-8,
            ``None`` for a tombstone, a pydantic model through its
            ``model_dump_json()``, a dataclass instance or any other object
            as JSON.
        id: the event id, carried in the app's first id header
            (``event-id`` by default). A fresh unique one unless given;
            ``None`` sends no id header at all (the app's ``missing_id``
            policy then decides), as does an id header already in ``headers``.
        key: the record key (``str`` as UTF-8).
        headers: more headers, after the id header.
        partition: where it goes; ``None``: by key, else partition 0 (see
            :meth:`partition_for`).
        timestamp: the record timestamp in ms; fixed when the message is
            made, so delivering it again carries the same one.
    """

    topic: str
    payload: object = None
    id: str | None = field(default_factory=fresh_id)
    key: bytes | str | None = None
    headers: Headers = ()
    partition: int | None = None
    timestamp: int = field(default_factory=_now_ms)

    def value(self) -> bytes | None:
        """The payload as the record's value bytes."""
        return encode_payload(self.payload)

    def partition_for(self, partitions: int) -> int:
        """The partition among ``partitions``: as given, else by key, else 0.

        A key always maps to the same partition (CRC-32 of the key bytes,
        not Kafka's murmur2: only stability matters here).

        Raises:
            ValueError: the given partition does not exist.
        """
        if self.partition is not None:
            if not 0 <= self.partition < partitions:
                raise ValueError(
                    f"partition {self.partition} of topic {self.topic!r}: the client has "
                    f"partitions 0..{partitions - 1} (InboxTestClient(partitions=...))"
                )
            return self.partition
        key = _bytes(self.key)
        return zlib.crc32(key) % partitions if key else 0

    def record(self, partition: int, offset: int, id_header: str) -> Record:
        """The record the broker would hand out at ``partition`` / ``offset``."""
        extra = header_list(self.headers)
        headers: list[Header] = []
        if self.id is not None and not any(name == id_header for name, _ in extra):
            headers.append((id_header, self.id.encode()))
        headers += extra
        return Record(
            self.topic, partition, offset, _bytes(self.key), self.value(), headers, self.timestamp
        )


def encode_payload(payload: object) -> bytes | None:
    """Encode ``payload`` as a record value (see :class:`Message`).

    Raises:
        TypeError: the payload is none of bytes, str, None, a model, a
            dataclass instance or JSON-serialisable.
    """
    if payload is None:
        return None
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    if isinstance(payload, str):
        return payload.encode()
    dump = getattr(payload, "model_dump_json", None)  # pydantic v2, without importing it
    if callable(dump):
        return str(dump()).encode()
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        payload = dataclasses.asdict(payload)
    return json.dumps(payload).encode()


def header_list(headers: Headers) -> list[Header]:
    """``headers`` as ``(name, bytes or None)`` pairs, in order."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    return [(name, _bytes(value)) for name, value in pairs]


def _bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value
