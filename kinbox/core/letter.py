"""A dead letter: the record given up, and the ``kinbox.dlq.*`` headers that say why.

A dead letter is the original record — key, value and headers unchanged, so
its event id travels with it — plus ``kinbox.dlq.*`` headers saying where it
came from and why it was given up:

=========================  ==================================================
``kinbox.dlq.topic``       original topic (replay publishes back to it)
``kinbox.dlq.partition``   original partition
``kinbox.dlq.offset``      original offset
``kinbox.dlq.consumer``    the consumer group that gave it up
``kinbox.dlq.reason``      ``handler-error``, ``retries-exhausted``,
                           ``invalid-id``, ``payload`` (it does not decode into
                           the handler's type; never retried) or
                           ``dead-letter-requested: <why>``
``kinbox.dlq.error.type``  exception class
``kinbox.dlq.error.message`` exception text, at most 1000 bytes
``kinbox.dlq.attempts``    handler tries made
``kinbox.dlq.time``        when, ISO 8601 UTC
=========================  ==================================================

A replay (``kinbox dlq replay``) re-publishes a dead letter to its original
topic with its original headers and a ``kinbox.replay`` header. Only a record
carrying that header may take over an event's ``dead_lettered`` row in
``processed_events`` (see :meth:`kinbox.core.inbox.InboxTransaction.claim`);
an ``applied`` row is never taken over, so replaying the same dead letter
twice still applies the event once.

The engine writes these headers, the console, the CLI and the middleware read
them; sending and replaying are :mod:`kinbox.apply.deadletter`'s.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from kinbox.core.describe import clean, describe, text, type_name
from kinbox.core.errors import TransportError
from kinbox.core.record import Record

PREFIX = "kinbox.dlq."
REPLAY_HEADER = "kinbox.replay"
"""Set by ``kinbox dlq replay``: ``<dlq topic>/<partition>/<offset>`` of the dead letter."""
MAX_MESSAGE_BYTES = 1000

HANDLER_ERROR = "handler-error"
RETRIES_EXHAUSTED = "retries-exhausted"
INVALID_ID = "invalid-id"
PAYLOAD = "payload"
"""The payload does not decode into the handler's type
(:class:`~kinbox.core.errors.InvalidPayload`)."""
REQUESTED = "dead-letter-requested"


@dataclass(frozen=True)
class Letter:
    """One record being given up.

    Attributes:
        record: the record as consumed.
        target: the dead-letter topic.
        consumer: the consumer group.
        reason: one of the reason codes (see the module docstring).
        error: what made it fail.
        attempts: handler tries made (0 when the handler never ran).
    """

    record: Record
    target: str
    consumer: str
    reason: str
    error: BaseException
    attempts: int

    @property
    def summary(self) -> str:
        """Reason, error type and message in one line, for the log and ``processed_events``.

        Never raises, and always storable (:mod:`kinbox.core.describe`), whatever
        the error's text holds.
        """
        return clean(f"{clean(self.reason)}: {describe(self.error)}", MAX_MESSAGE_BYTES)


RECORD_OVERHEAD_BYTES = 256
"""Room left for a record's framing (batch header, lengths, varints) when sizing headers."""

# kinbox.dlq.* headers, the first ones the most needed: when a record is too
# close to the dead-letter topic's size limit, the last ones go first and
# ``error.message`` is shortened before anything is dropped.
_ESSENTIAL = ("topic", "partition", "offset", "consumer", "reason")
_SHORT_MESSAGE = 64
_FIELD_LIMITS = {"reason": 500, "error.type": 200, "error.message": MAX_MESSAGE_BYTES}


def headers(
    letter: Letter, now: dt.datetime | None = None, max_bytes: int | None = None
) -> list[tuple[str, bytes | None]]:
    """The dead letter's headers: the original ones, then the ``kinbox.dlq.*`` ones.

    With ``max_bytes`` (the dead-letter topic's record size limit) the
    ``kinbox.dlq.*`` headers are shortened or left out, least needed first,
    so that they never push the record over the limit: ``error.message`` is
    cut, then ``time``, ``attempts``, ``error.type`` and ``error.message`` are
    dropped; where from and why (topic, partition, offset, consumer, reason)
    always stay.

    Raises:
        TransportError: even the original record with only the essential
            headers is over ``max_bytes``; it cannot be dead-lettered there.
    """
    r = letter.record
    when = (now or dt.datetime.now(dt.UTC)).isoformat(timespec="milliseconds")
    extra = {
        "topic": r.topic,
        "partition": str(r.partition),
        "offset": str(r.offset),
        "consumer": letter.consumer,
        "reason": clean(letter.reason),
        "error.type": type_name(letter.error),
        "error.message": text(letter.error, MAX_MESSAGE_BYTES),
        "attempts": str(letter.attempts),
        "time": when,
    }
    encoded = {
        name: _truncate_bytes(_encode(value), _FIELD_LIMITS.get(name))
        for name, value in extra.items()
    }
    original = [(k, v) for k, v in r.headers if not k.startswith(PREFIX)]
    if max_bytes is not None:
        encoded = _fit(letter, original, encoded, max_bytes)
    return original + [(PREFIX + k, v) for k, v in encoded.items()]


def _fit(
    letter: Letter,
    original: Sequence[tuple[str, bytes | None]],
    encoded: dict[str, bytes],
    max_bytes: int,
) -> dict[str, bytes]:
    """Shrink ``encoded`` until the whole record fits ``max_bytes`` (see :func:`headers`)."""
    r = letter.record
    base = RECORD_OVERHEAD_BYTES + len(r.key or b"") + len(r.value or b"")
    base += sum(len(k.encode("utf-8", "backslashreplace")) + len(v or b"") for k, v in original)

    def size() -> int:
        return base + sum(len(PREFIX) + len(k) + len(v) for k, v in encoded.items())

    # Cut the message first (it is the longest and least needed whole), then
    # drop the optional headers, least needed first.
    message = encoded.get("error.message", b"")
    if size() > max_bytes and len(message) > _SHORT_MESSAGE:
        keep = max(_SHORT_MESSAGE, len(message) - (size() - max_bytes))
        encoded["error.message"] = _truncate_bytes(message, keep)
    for name in ("time", "attempts", "error.type", "error.message"):
        if size() <= max_bytes:
            break
        encoded.pop(name, None)
    if size() > max_bytes:
        raise TransportError(
            f"{r.topic}[{r.partition}]@{r.offset} cannot be dead-lettered to "
            f"{letter.target!r}: the record is {size()} bytes with kinbox's headers, the topic "
            f"accepts at most {max_bytes}; raise {letter.target!r}'s max.message.bytes",
            retriable=False,
        )
    return encoded


def header(record: Record, name: str) -> str | None:
    """The first ``name`` header of ``record`` as text, or ``None``."""
    for key, value in record.headers:
        if key == name and value is not None:
            return value.decode("utf-8", "replace")
    return None


def replay_headers(record: Record) -> list[tuple[str, bytes | None]]:
    """Original headers of a dead letter, marked as a replay of it."""
    kept = [(k, v) for k, v in record.headers if not k.startswith(PREFIX) and k != REPLAY_HEADER]
    mark = f"{record.topic}/{record.partition}/{record.offset}".encode()
    return [*kept, (REPLAY_HEADER, mark)]


def _encode(text: str) -> bytes:
    """UTF-8, with anything unencodable (a lone surrogate) escaped instead of failing."""
    return text.encode("utf-8", "backslashreplace")


def _truncate_bytes(raw: bytes, limit: int | None) -> bytes:
    """``raw`` cut to at most ``limit`` bytes on a character boundary, marked with ``...``."""
    if limit is None or len(raw) <= limit:
        return raw
    return raw[: limit - 3].decode("utf-8", "ignore").encode("utf-8") + b"..."


def is_replay(headers_: Sequence[tuple[str, bytes | None]]) -> bool:
    """Whether a record carries the ``kinbox.replay`` header."""
    # A loop, not any() over a generator (a third of the cost): asked of
    # every event of every batch.
    for key, _ in headers_:  # noqa: SIM110
        if key == REPLAY_HEADER:
            return True
    return False
