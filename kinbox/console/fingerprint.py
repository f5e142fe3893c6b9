"""A dead letter's cause, and its fingerprint: what groups dead letters in the console.

The cause is read from the ``kinbox.dlq.*`` headers
(:mod:`kinbox.apply.deadletter`): the reason, the exception type, and the
handler that gave the record up — the consumer group and the record's
original topic. Dead letters with the same cause have the same fingerprint,
whatever their payload, partition or time.

The reason is normalised first, as error trackers group their events:
a reason may quote data (``dead-letter-requested: customer 4711 unknown``),
and one group per customer would hide the pattern. UUIDs, long hex runs
and numbers become ``<id>``, ``<hex>`` and ``<n>``. The exception *message*
is not part of the cause: it quotes data far more often, and the group's
samples show it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from kinbox.core.letter import PREFIX, header
from kinbox.core.record import Record

_UUID = re.compile(
    r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
)
_HEX = re.compile(r"\b(?=[0-9a-fA-F]*[0-9])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_LENGTH = 16
"""Hex characters of a fingerprint: 64 bits, no collision among any number of causes seen."""


@dataclass(frozen=True)
class LetterCause:
    """Why a dead letter was given up, and by which handler.

    Attributes:
        reason: the normalised ``kinbox.dlq.reason`` (see the module docstring).
        error_type: ``kinbox.dlq.error.type``; empty when the header was left out.
        group: ``kinbox.dlq.consumer``, the consumer group.
        topic: ``kinbox.dlq.topic``, the topic the record came from.
    """

    reason: str
    error_type: str
    group: str
    topic: str

    @property
    def fingerprint(self) -> str:
        """A stable hash of the four: the same on every run and every machine."""
        joined = "\x1f".join((self.reason, self.error_type, self.group, self.topic))
        return hashlib.sha256(joined.encode("utf-8", "backslashreplace")).hexdigest()[:_LENGTH]


def normalise(reason: str) -> str:
    """``reason`` with the parts that name data (ids, numbers) replaced by placeholders."""
    reason = _UUID.sub("<id>", reason)
    reason = _HEX.sub("<hex>", reason)
    return _NUMBER.sub("<n>", reason).strip()


def cause(record: Record) -> LetterCause | None:
    """The cause of a dead letter, or ``None`` for a record that is none (no origin header)."""
    topic = header(record, PREFIX + "topic")
    if topic is None:
        return None
    return LetterCause(
        reason=normalise(header(record, PREFIX + "reason") or "unknown"),
        error_type=header(record, PREFIX + "error.type") or "",
        group=header(record, PREFIX + "consumer") or "",
        topic=topic,
    )


def is_fingerprint(text: str) -> bool:
    """Whether ``text`` has the shape of a fingerprint (for a path parameter)."""
    return len(text) == _LENGTH and all(c in "0123456789abcdef" for c in text)
